package clientaddr

import (
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	got, err := Parse("10.0.0.0/8, 192.0.2.7 ,::1,10.1.2.3/16,")
	if err != nil {
		t.Fatal(err)
	}
	want := Trusted{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.1.0.0/16")}
	if !slices.Equal(got, want) {
		t.Fatalf("Parse = %v, want %v", got, want)
	}
	if _, err := Parse("edge.local"); err == nil || !strings.Contains(err.Error(), `"edge.local"`) {
		t.Fatalf("a name: %v", err)
	}
}

// TestClient: only a trusted peer's X-Forwarded-For counts, and of it only the
// hops written by trusted proxies; what a client writes further left is not
// believed.
func TestClient(t *testing.T) {
	trusted, _ := Parse("127.0.0.1, 10.0.0.0/8")
	for _, c := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"203.0.113.5", []string{"1.2.3.4"}, "203.0.113.5"},                     // an untrusted peer names nobody
		{"127.0.0.1", nil, "127.0.0.1"},                                         // a trusted peer that names nobody
		{"127.0.0.1", []string{"1.2.3.4, 198.51.100.9"}, "198.51.100.9"},        // the last hop, not what the client wrote
		{"127.0.0.1", []string{"198.51.100.9, 10.1.1.1"}, "198.51.100.9"},       // past a second trusted proxy
		{"127.0.0.1", []string{"1.2.3.4", "198.51.100.9:4711"}, "198.51.100.9"}, // two headers; a hop with a port
		{"127.0.0.1", []string{"1.2.3.4, junk, 10.1.1.1"}, "10.1.1.1"},          // an unparseable hop stops the walk
		{"127.0.0.1", []string{"10.1.1.1"}, "10.1.1.1"},                         // every hop trusted: the first
	} {
		if got := trusted.Client(c.peer, c.xff); got != c.want {
			t.Errorf("Client(%s, %q) = %s, want %s", c.peer, c.xff, got, c.want)
		}
	}
	r := httptest.NewRequest("POST", "/hooks/shop", nil)
	r.RemoteAddr = "[::ffff:127.0.0.1]:5000"
	r.Header.Set("X-Forwarded-For", "198.51.100.9")
	if got := trusted.OfRequest(r); got != "198.51.100.9" {
		t.Errorf("OfRequest of a v4-mapped trusted peer: %s", got)
	}
	if got := Trusted(nil).OfRequest(r); got != "127.0.0.1" {
		t.Errorf("OfRequest with nothing trusted: %s", got)
	}
}
