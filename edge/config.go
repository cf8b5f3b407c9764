package edge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"bex.co/bex/internal/clientaddr"
)

// Config is the edge's configuration; DefaultConfig gives the defaults, and a zero
// field means its default.
type Config struct {
	// BaseDomain is the domain under which every app answers at <app>.<BaseDomain>.
	BaseDomain string
	// Namespace is the namespace of the Apps and their EndpointSlices.
	Namespace string

	// DialTimeout bounds a TCP connect to a backend. Backends are on the same host or
	// cluster, so a slow dial means a dead backend: better fail fast and answer 502.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a backend's response headers after the
	// request is written (504 past it). Streams are unaffected once headers arrive.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout is how long an idle kept-alive connection to a backend is kept.
	IdleConnTimeout time.Duration
	// MaxIdleConns and MaxIdleConnsPerHost bound the pool of idle backend connections.
	// Per host is well above net/http's default of 2: all of an app's traffic goes to
	// few backends, and a small pool would dial a new connection per burst.
	MaxIdleConns        int
	MaxIdleConnsPerHost int

	// MaxHeaderBytes bounds a client's request headers and a backend's response
	// headers.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds the wait for a client's request headers (slowloris).
	ReadHeaderTimeout time.Duration
	// ClientIdleTimeout is how long an idle kept-alive client connection is kept.
	ClientIdleTimeout time.Duration

	// PlatformBackend, when set, is the host:port of bex's own HTTP endpoints (the
	// webhooks under /hooks/ and the agents' MCP endpoint at /mcp), served at
	// https://PlatformHost/hooks/... and /mcp with the same certificates as the apps.
	// Git hosts and agents elsewhere need them over TLS on a public address; the
	// gitserver serves them on plain HTTP, on loopback.
	PlatformBackend string
	// PlatformHost is the host the platform's endpoints answer at. Default
	// BaseDomain itself: no app can have it (apps are <app>.<BaseDomain>).
	PlatformHost string
	// PlatformSecret, when set, is sent in clientaddr.HeaderProxySecret on every
	// request to PlatformBackend, and on no other: it tells the gitserver that
	// the X-Forwarded-For of the request is the edge's, where the edge's
	// address cannot (a cluster, whose pods share its networks). A client's own
	// copy of the header is dropped from every request, to apps too.
	PlatformSecret []byte

	// TrustedProxies are the addresses of load balancers in front of the edge,
	// which it believes about the client's address: the client a PROXY protocol
	// header names (see Proxy.ProxyProtocol), and the last hop of a request's
	// X-Forwarded-For that is not itself a trusted proxy. From every other
	// address, the client is the connection's peer. Empty: nobody is trusted.
	TrustedProxies []netip.Prefix

	// OrdersPerDomain and Orders bound the new certificates that the edge
	// orders, ahead of time for the table's exact hosts (apps' hosts under the
	// base domain and custom domains) and on demand at a TLS handshake (names
	// under a wildcard domain, or a host refused ahead of time): per registered
	// domain (all the names under shop.example.com count as one), and in all.
	// An order past either is not made until the bound has room again (a host
	// refused ahead of time gets its certificate at a handshake then), and is
	// counted in bex_edge_certificate_refusals_total. Renewals and certificates
	// already in storage do not count.
	OrdersPerDomain, Orders OrderRate
}

// OrderRate is N certificate orders per Per, in a burst or spread out.
type OrderRate struct {
	N   int
	Per time.Duration
}

func (r OrderRate) String() string { return fmt.Sprintf("%d per %s", r.N, r.Per) }

// PlatformPaths are the paths of bex's own endpoints on the platform host; every
// other path there is 404, so the platform host exposes nothing else.
var PlatformPaths = []string{"/hooks/", "/mcp"}

// IsPlatformPath reports whether path is one of PlatformPaths ("/mcp" exactly or
// below it, anything below "/hooks/").
func IsPlatformPath(path string) bool {
	for _, p := range PlatformPaths {
		if path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

// Defaults.
const (
	// DefaultHTTPAddr and DefaultHTTPSAddr are where the edge listens (bex edge's
	// --http-addr and --https-addr, bex up's).
	DefaultHTTPAddr              = ":80"
	DefaultHTTPSAddr             = ":443"
	DefaultBaseDomain            = "localhost"
	DefaultNamespace             = "default"
	DefaultDialTimeout           = 5 * time.Second
	DefaultResponseHeaderTimeout = 60 * time.Second
	DefaultIdleConnTimeout       = 90 * time.Second
	DefaultMaxIdleConns          = 1024
	DefaultMaxIdleConnsPerHost   = 64
	DefaultMaxHeaderBytes        = 1 << 20
	DefaultReadHeaderTimeout     = 10 * time.Second
	DefaultClientIdleTimeout     = 120 * time.Second
)

// Default order rates: well inside Let's Encrypt's limits (50 certificates per
// registered domain a week, 300 new orders per account in 3 hours), so that
// names someone invents under a wildcard cannot use up what the real ones need.
var (
	DefaultOrdersPerDomain = OrderRate{N: 10, Per: 24 * time.Hour}
	DefaultOrders          = OrderRate{N: 100, Per: 3 * time.Hour}
)

// DefaultConfig returns the edge's defaults. A zero field of a Config means its
// default too: NewTable, NewProxy and Validate fill them in (PlatformHost only
// when PlatformBackend is set).
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	set := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	if c.BaseDomain == "" {
		c.BaseDomain = DefaultBaseDomain
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	set(&c.DialTimeout, DefaultDialTimeout)
	set(&c.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	set(&c.IdleConnTimeout, DefaultIdleConnTimeout)
	set(&c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	set(&c.ClientIdleTimeout, DefaultClientIdleTimeout)
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = DefaultMaxIdleConns
	}
	if c.MaxIdleConnsPerHost == 0 {
		c.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.OrdersPerDomain == (OrderRate{}) {
		c.OrdersPerDomain = DefaultOrdersPerDomain
	}
	if c.Orders == (OrderRate{}) {
		c.Orders = DefaultOrders
	}
	if c.PlatformBackend != "" && c.PlatformHost == "" {
		c.PlatformHost = strings.TrimSuffix(c.BaseDomain, ".")
	}
	return c
}

// Validate reports every problem of c, its zero fields taken as their defaults,
// each naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bd := strings.TrimSuffix(c.BaseDomain, ".")
	if bd != strings.ToLower(bd) {
		errs = append(errs, fmt.Errorf("Config.BaseDomain %q: must be lower case", c.BaseDomain))
	} else if msgs := validation.IsDNS1123Subdomain(bd); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("Config.BaseDomain %q: %s", c.BaseDomain, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("Config.Namespace %q: %s", c.Namespace, strings.Join(msgs, "; ")))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DialTimeout", c.DialTimeout}, {"ResponseHeaderTimeout", c.ResponseHeaderTimeout},
		{"IdleConnTimeout", c.IdleConnTimeout}, {"ReadHeaderTimeout", c.ReadHeaderTimeout},
		{"ClientIdleTimeout", c.ClientIdleTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("Config.%s %s: must be positive", d.name, d.v))
		}
	}
	if c.MaxIdleConns < 0 {
		errs = append(errs, fmt.Errorf("Config.MaxIdleConns %d: must not be negative", c.MaxIdleConns))
	}
	if c.MaxIdleConnsPerHost < 0 {
		errs = append(errs, fmt.Errorf("Config.MaxIdleConnsPerHost %d: must not be negative", c.MaxIdleConnsPerHost))
	}
	if c.MaxHeaderBytes < 4096 {
		errs = append(errs, fmt.Errorf("Config.MaxHeaderBytes %d: must be at least 4096", c.MaxHeaderBytes))
	}
	if c.PlatformBackend != "" {
		if _, _, err := net.SplitHostPort(c.PlatformBackend); err != nil {
			errs = append(errs, fmt.Errorf("Config.PlatformBackend %q: want HOST:PORT (%v)", c.PlatformBackend, err))
		}
		if msgs := validation.IsDNS1123Subdomain(c.PlatformHost); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("Config.PlatformHost %q: %s", c.PlatformHost, strings.Join(msgs, "; ")))
		}
	}
	if c.PlatformSecret != nil {
		if c.PlatformBackend == "" {
			errs = append(errs, errors.New("Config.PlatformSecret: set without PlatformBackend, which it is sent to"))
		} else if err := clientaddr.CheckSecret(c.PlatformSecret); err != nil {
			errs = append(errs, fmt.Errorf("Config.PlatformSecret: %w", err))
		}
	}
	for _, r := range []struct {
		name string
		v    OrderRate
	}{{"OrdersPerDomain", c.OrdersPerDomain}, {"Orders", c.Orders}} {
		if r.v.N < 1 || r.v.Per <= 0 {
			errs = append(errs, fmt.Errorf("Config.%s %s: want at least 1 per a positive duration", r.name, r.v))
		}
	}
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("Config.TrustedProxies[%d] %s: not a CIDR", i, p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	return nil
}
