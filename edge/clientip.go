package edge

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/pires/go-proxyproto"
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
// that the client is ip and nothing else about the client's address.
func setClientAddr(h http.Header, ip string) {
	for _, k := range clientAddrHeaders {
		delete(h, k)
	}
	for k := range h {
		if strings.IndexByte(k, '_') >= 0 && isClientAddrHeader(k) {
			delete(h, k)
		}
	}
	h["X-Forwarded-For"] = []string{ip}
	h["X-Real-Ip"] = []string{ip}
}

// trusts reports whether ip is one of the Config's TrustedProxies.
func (c Config) trusts(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	for _, p := range c.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientIP is the address of the client of a request that reached the edge from
// peer (the connection's remote host: the socket's peer, or the client a trusted
// proxy's PROXY header named) with the X-Forwarded-For values xff. From a trusted
// proxy, it is the last hop of xff that is not a trusted proxy itself (hops
// further left were written by whoever sent the request, and can say anything);
// from anyone else, peer.
func (p *Proxy) clientIP(peer string, xff []string) string {
	if len(p.cfg.TrustedProxies) == 0 || len(xff) == 0 {
		return peer
	}
	if a, err := netip.ParseAddr(peer); err != nil || !p.cfg.trusts(a) {
		return peer
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := strings.Split(xff[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			a, ok := parseHop(strings.TrimSpace(hops[j]))
			if !ok {
				// Not an address: whoever wrote it is not a proxy we know, and
				// the last hop read is the best account of the client.
				return client
			}
			client = a.String()
			if !p.cfg.trusts(a) {
				return client
			}
		}
	}
	return client // every hop a trusted proxy: the first is the client
}

// parseHop reads one X-Forwarded-For hop: an address, with a port (some load
// balancers add it) or without.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// ParseTrustedProxies reads a comma-separated list of CIDRs or single addresses
// (a /32 or /128), for Config.TrustedProxies.
func ParseTrustedProxies(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR (10.0.0.0/8) nor an address", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
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
				if a, ok := netip.AddrFromSlice(ta.IP); ok && p.cfg.trusts(a) {
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
