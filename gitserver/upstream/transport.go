package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"golang.org/x/net/proxy"
)

// HTTPClient is the client go-git's https transport fetches with: every
// connection through p's Dialer (a redirect too), no proxy from the
// environment (the proxy would dial, unchecked), TLS verified as usual.
// roots, when not nil, are the CAs the server's certificate is checked against
// in place of the system's.
func (p Policy) HTTPClient(timeout time.Duration, roots *x509.CertPool) *http.Client {
	d := p.Dialer(30 * time.Second)
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			DialContext:         d.DialContext,
			ForceAttemptHTTP2:   true,
			TLSHandshakeTimeout: 30 * time.Second,
			MaxIdleConns:        4,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("stopped after 5 redirects")
			}
			if req.URL.Scheme != "https" {
				return errors.New("an upstream may redirect to https only")
			}
			return nil
		},
	}
}

// proxyScheme is the proxy URL scheme whose "proxy" is a checked Dialer.
// go-git's ssh transport has no dialer to set: it dials through the endpoint's
// proxy (golang.org/x/net/proxy) when one is given, else straight. The scheme is
// registered with x/net/proxy once; the host says which of the two checks
// applies.
const proxyScheme = "bex-checked-dial"

var registerProxy sync.Once

// ProxyOptions returns what an ssh endpoint's Proxy is set to so that go-git's
// ssh transport dials through p's Dialer.
func (p Policy) ProxyOptions() transport.ProxyOptions {
	registerProxy.Do(func() {
		proxy.RegisterDialerType(proxyScheme, func(u *url.URL, _ proxy.Dialer) (proxy.Dialer, error) {
			switch u.Host {
			case "public":
				return Policy{}.Dialer(30 * time.Second), nil
			case "private":
				return Policy{AllowPrivate: true}.Dialer(30 * time.Second), nil
			}
			return nil, errors.New("unknown checked dialer " + u.Host)
		})
	})
	host := "public"
	if p.AllowPrivate {
		host = "private"
	}
	return transport.ProxyOptions{URL: proxyScheme + "://" + host}
}

var _ proxy.ContextDialer = (*net.Dialer)(nil)
