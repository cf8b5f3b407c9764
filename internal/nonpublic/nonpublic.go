package nonpublic

import "net/netip"

// Range is one range of the list and what to call an address in it.
type Range struct {
	Prefix netip.Prefix
	What   string // "a loopback address", "the cloud metadata address", ...
}

// ranges is the list. The metadata addresses come before the link-local ranges
// that hold them, so that What names them as such.
var ranges = []Range{
	{netip.MustParsePrefix("169.254.169.254/32"), "the cloud metadata address"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "the cloud metadata address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address"},
	{netip.MustParsePrefix("::/128"), "an unspecified address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a private (CGNAT) address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (ULA) address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the broadcast address"},
}

// Ranges returns the list (a copy), most specific first where ranges nest.
func Ranges() []Range { return append([]Range(nil), ranges...) }

// IPv4 returns the list's IPv4 prefixes with those inside another left out
// (169.254.169.254/32 is in 169.254.0.0/16): the ranges a filter on IPv4 traffic
// needs, each once.
func IPv4() []netip.Prefix {
	var out []netip.Prefix
	for _, r := range ranges {
		if !r.Prefix.Addr().Is4() {
			continue
		}
		inside := false
		for _, o := range ranges {
			if o.Prefix != r.Prefix && o.Prefix.Bits() < r.Prefix.Bits() && o.Prefix.Contains(r.Prefix.Addr()) {
				inside = true
			}
		}
		if !inside {
			out = append(out, r.Prefix)
		}
	}
	return out
}

// What says what ip is when it is in the list ("a loopback address"), or ""
// when it is a public address. An IPv4 address mapped into IPv6
// (::ffff:127.0.0.1) is judged as the IPv4 one, a zoned one (fe80::1%eth0)
// without its zone.
func What(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	for _, r := range ranges {
		if r.Prefix.Contains(ip) {
			return r.What
		}
	}
	return ""
}
