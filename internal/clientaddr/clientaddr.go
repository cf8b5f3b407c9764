package clientaddr

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
)

// HeaderProxySecret carries the secret that bex's edge shares with the
// gitserver (bex edge --platform-secret-file, bex gitserver
// --hooks-proxy-secret-file) on every request it proxies to bex's own
// endpoints. On a cluster the edge's address cannot vouch for it: the edge
// reaches the gitserver from a node's address, and a tenant's pod reaches the
// gitserver too, from addresses of the same networks, where the CNI enforces
// no NetworkPolicy. The secret is what tells the edge's requests apart. The
// edge drops a client's copy from every request, so only the edge ever sends
// it, and only to the gitserver.
const HeaderProxySecret = "X-Bex-Edge-Secret"

// MinSecretBytes is the shortest proxy secret taken: a guessable one would let
// a tenant name any source it likes.
const MinSecretBytes = 16

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
	if len(t) == 0 {
		return peer
	}
	a, err := netip.ParseAddr(peer)
	return t.client(peer, err == nil && t.Contains(a), xff)
}

// client is Client with the peer's trust decided by the caller: the peer is
// in t, or it showed the proxy secret.
func (t Trusted) client(peer string, peerTrusted bool, xff []string) string {
	if !peerTrusted || len(xff) == 0 {
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
func (t Trusted) OfRequest(r *http.Request) string { return t.OfProxiedRequest(r, nil) }

// OfProxiedRequest is OfRequest, with one more trusted proxy: whoever sent r
// with secret in HeaderProxySecret (bex's edge, from any address). A wrong or
// missing secret, or an empty one here, vouches for nobody: r's peer is then
// trusted only by its address.
func (t Trusted) OfProxiedRequest(r *http.Request, secret []byte) string {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err == nil {
		a = a.Unmap().WithZone("")
		host = a.String()
	}
	trusted := (err == nil && t.Contains(a)) || Vouched(r.Header, secret)
	return t.client(host, trusted, r.Header.Values("X-Forwarded-For"))
}

// Vouched reports whether h carries secret in HeaderProxySecret, compared in
// constant time (a tenant that can time the answers learns nothing of it). An
// empty secret vouches for nobody; so do two copies of the header, which the
// edge never sends.
func Vouched(h http.Header, secret []byte) bool {
	if len(secret) == 0 {
		return false
	}
	v := h.Values(HeaderProxySecret)
	return len(v) == 1 && subtle.ConstantTimeCompare([]byte(v[0]), secret) == 1
}

// CheckSecret says what is wrong with secret as a proxy secret: too short to
// be unguessable, or bytes a header value cannot carry as they are.
func CheckSecret(secret []byte) error {
	if len(secret) < MinSecretBytes {
		return fmt.Errorf("%d bytes, want at least %d random ones (openssl rand -hex 32)", len(secret), MinSecretBytes)
	}
	for _, c := range secret {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("holds a byte (%#02x) other than printable ASCII; want a token such as openssl rand -hex 32 writes", c)
		}
	}
	return nil
}

// ReadSecret reads a proxy secret from path: the file's content without
// surrounding white space (a trailing newline), checked by CheckSecret.
func ReadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = []byte(strings.TrimSpace(string(b)))
	if err := CheckSecret(b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
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
