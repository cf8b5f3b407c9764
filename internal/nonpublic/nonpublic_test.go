package nonpublic_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"bex.co/bex/internal/nonpublic"
)

func TestWhat(t *testing.T) {
	for ip, want := range map[string]string{
		"127.0.0.1": "loopback", "127.8.9.10": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
		"10.0.0.1": "private", "172.16.5.4": "private", "172.31.255.255": "private", "192.168.1.1": "private",
		"100.64.0.1": "CGNAT", "100.127.255.254": "CGNAT", "fd12:3456::1": "ULA", "fc00::1": "ULA",
		"169.254.1.1": "link-local", "fe80::1": "link-local", "fe80::1%eth0": "link-local",
		"169.254.169.254": "metadata", "fd00:ec2::254": "metadata", "::ffff:169.254.169.254": "metadata",
		"0.0.0.0": "unspecified", "::": "unspecified", "224.0.0.1": "multicast", "239.1.2.3": "multicast",
		"ff02::1": "multicast", "255.255.255.255": "broadcast",
	} {
		if got := nonpublic.What(netip.MustParseAddr(ip)); !strings.Contains(got, want) {
			t.Errorf("What(%s) = %q, want %q", ip, got, want)
		}
	}
	// The control: public addresses, and the neighbours of the ranges.
	for _, ip := range []string{"1.1.1.1", "8.8.8.8", "140.82.112.3", "9.255.255.255", "11.0.0.0", "172.32.0.1", "172.15.255.255",
		"192.169.0.1", "100.128.0.1", "100.63.255.255", "169.255.0.1", "223.255.255.255", "2606:4700::1111", "fe00::1"} {
		if got := nonpublic.What(netip.MustParseAddr(ip)); got != "" {
			t.Errorf("What(%s) = %q, want public", ip, got)
		}
	}
}

// TestIPv4 checks that the filter's list covers every IPv4 range of the list,
// each address of it once.
func TestIPv4(t *testing.T) {
	v4 := nonpublic.IPv4()
	if slices.Contains(v4, netip.MustParsePrefix("169.254.169.254/32")) {
		t.Errorf("IPv4() holds the metadata address beside 169.254.0.0/16: %v", v4)
	}
	for _, r := range nonpublic.Ranges() {
		if !r.Prefix.Addr().Is4() {
			continue
		}
		n := 0
		for _, p := range v4 {
			if p.Contains(r.Prefix.Addr()) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s (%s) is in %d prefixes of IPv4() %v, want 1", r.Prefix, r.What, n, v4)
		}
	}
	for _, p := range v4 {
		if !p.Addr().Is4() || p != p.Masked() {
			t.Errorf("IPv4() holds %s", p)
		}
	}
}
