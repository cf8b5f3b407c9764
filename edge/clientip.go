package edge

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/pires/go-proxyproto"

	"bex.co/bex/internal/clientaddr"
)

// clientAddrHeaders are the request headers that name the client's address,
// which many frameworks trust as it (Rails, Django, Express and PHP apps behind
// a proxy, rate limiters, audit logs). A client sends what it likes in them, so
// the edge drops every one a client sent and sets X-Real-IP and X-Forwarded-For
// itself; X-Forwarded-Host and -Proto are set from what the edge saw by
// ReverseProxy and by the lane.
var clientAddrHeaders = []string{"X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "Forwarded", "X-Forwarded-For"}

// isClientAddrHeader reports whether k, a canonical header name with an
// underscore, is one of clientAddrHeaders or X-Forwarded-Host/-Proto spelt with
// underscores: CGI, WSGI, PHP and Rack turn both X-Real-IP and X_Real_IP into
// HTTP_X_REAL_IP, so the second would pass for the first.
func isClientAddrHeader(k string) bool {
	k = http.CanonicalHeaderKey(strings.ReplaceAll(k, "_", "-"))
	return k == "X-Forwarded-Host" || k == "X-Forwarded-Proto" || slices.Contains(clientAddrHeaders, k)
}

// setClientAddr makes h, the headers of a request on its way to an app, say
// that the client is ip and nothing else about the client's address. It drops
// the proxy secret's header too, which would vouch for that address at the
// gitserver: only the edge sets it, on the platform's requests (Proxy.rewrite),
// never passing on a client's.
func setClientAddr(h http.Header, ip string) {
	for _, k := range clientAddrHeaders {
		delete(h, k)
	}
	delete(h, clientaddr.HeaderProxySecret)
	for k := range h {
		if strings.IndexByte(k, '_') >= 0 && isClientAddrHeader(k) {
			delete(h, k)
		}
	}
	h["X-Forwarded-For"] = []string{ip}
	h["X-Real-Ip"] = []string{ip}
}

// ProxyProtocol returns l with the PROXY protocol (v1 and v2, as HAProxy and
// Hetzner's, AWS's and others' load balancers send it) understood on the
// connections from the Config's TrustedProxies: a connection from one of them
// may start with a PROXY header, and its RemoteAddr is then the client the
// header names. A connection from any other address is served as it is, its
// bytes unread by the PROXY parser: a PROXY header from there is a malformed
// request (400) or TLS handshake, never an address the edge believes. Without
// trusted proxies, l itself. Wrap the TCP listener, under the TLS one.
func (p *Proxy) ProxyProtocol(l net.Listener) net.Listener {
	if len(p.cfg.TrustedProxies) == 0 {
		return l
	}
	return &proxyproto.Listener{
		Listener: l,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if ta, ok := o.Upstream.(*net.TCPAddr); ok {
				if a, ok := netip.AddrFromSlice(ta.IP); ok && clientaddr.Trusted(p.cfg.TrustedProxies).Contains(a) {
					// USE, not REQUIRE: a trusted load balancer may as well speak
					// plain HTTP with X-Forwarded-For (see clientIP).
					return proxyproto.USE, nil
				}
			}
			return proxyproto.SKIP, nil
		},
		// The header comes first, at once: as long as the request head may take.
		ReadHeaderTimeout: p.cfg.ReadHeaderTimeout,
	}
}
