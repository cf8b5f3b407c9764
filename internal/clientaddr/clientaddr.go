package clientaddr

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Trusted are the proxies whose account of the client is believed.
type Trusted []netip.Prefix

// Parse reads a comma-separated list of CIDRs or single addresses (a /32 or
// /128), as the --trusted-proxies flags take them.
func Parse(list string) (Trusted, error) {
	var out Trusted
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

// Contains reports whether ip is a trusted proxy.
func (t Trusted) Contains(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	for _, p := range t {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Client is the client of a request that came from peer (an address) with the
// X-Forwarded-For values xff: from a trusted peer, the last hop of xff that is
// not a trusted proxy (an unparseable hop stops the walk: whoever wrote it is
// no proxy we know, and the hop read before it is the best account); from
// anyone else, peer.
func (t Trusted) Client(peer string, xff []string) string {
	if len(t) == 0 || len(xff) == 0 {
		return peer
	}
	if a, err := netip.ParseAddr(peer); err != nil || !t.Contains(a) {
		return peer
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := strings.Split(xff[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			a, ok := parseHop(strings.TrimSpace(hops[j]))
			if !ok {
				return client
			}
			client = a.String()
			if !t.Contains(a) {
				return client
			}
		}
	}
	return client // every hop a trusted proxy: the first is the client
}

// OfRequest is the client of r (Client of r.RemoteAddr's host and its
// X-Forwarded-For).
func (t Trusted) OfRequest(r *http.Request) string {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().WithZone("").String()
	}
	return t.Client(host, r.Header.Values("X-Forwarded-For"))
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
