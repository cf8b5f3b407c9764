package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestParsePrefixes: --hooks-trusted-proxies takes CIDRs and single addresses,
// and names what it cannot read.
func TestParsePrefixes(t *testing.T) {
	got, err := parsePrefixes([]string{"10.0.0.0/8", " 192.0.2.7 ", "::1", "10.1.2.3/16", ""})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.1.0.0/16")}
	if !slices.Equal(got, want) {
		t.Fatalf("parsePrefixes = %v, want %v", got, want)
	}
	if _, err := parsePrefixes([]string{"edge.local"}); err == nil || !strings.Contains(err.Error(), `"edge.local"`) {
		t.Fatalf("a name: %v", err)
	}
}
