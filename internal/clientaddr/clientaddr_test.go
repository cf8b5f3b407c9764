package clientaddr

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
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

// TestOfProxiedRequest: the proxy secret makes any peer a trusted proxy (the
// edge on a cluster, whose address a tenant's pod shares the networks of);
// without it, with a wrong one, or with two copies, the peer is the client.
func TestOfProxiedRequest(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	trusted, _ := Parse("127.0.0.1")
	req := func(peer, xff string, secrets ...string) *http.Request {
		r := httptest.NewRequest("POST", "/mcp", nil)
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		for _, s := range secrets {
			r.Header.Add(HeaderProxySecret, s)
		}
		return r
	}
	for _, c := range []struct {
		name   string
		r      *http.Request
		secret []byte
		want   string
	}{
		{"the edge's secret", req("10.244.0.1:4000", "198.51.100.9", string(secret)), secret, "198.51.100.9"},
		{"the secret, past a client's own hops", req("10.244.0.1:4000", "6.6.6.6, 198.51.100.9", string(secret)), secret, "198.51.100.9"},
		{"no secret", req("10.244.0.7:4000", "198.51.100.9"), secret, "10.244.0.7"},
		{"a wrong secret", req("10.244.0.7:4000", "198.51.100.9", "0123456789abcdef0123456789abcdeX"), secret, "10.244.0.7"},
		{"a prefix of the secret", req("10.244.0.7:4000", "198.51.100.9", string(secret[:16])), secret, "10.244.0.7"},
		{"an empty header", req("10.244.0.7:4000", "198.51.100.9", ""), secret, "10.244.0.7"},
		{"two copies, one right", req("10.244.0.7:4000", "198.51.100.9", "wrong", string(secret)), secret, "10.244.0.7"},
		{"no secret configured: an empty header vouches for nobody", req("10.244.0.7:4000", "198.51.100.9", ""), nil, "10.244.0.7"},
		{"a trusted peer needs no secret", req("127.0.0.1:4000", "198.51.100.9"), secret, "198.51.100.9"},
	} {
		if got := trusted.OfProxiedRequest(c.r, c.secret); got != c.want {
			t.Errorf("%s: OfProxiedRequest = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		content, want, err string
	}{
		{"0123456789abcdef0123456789abcdef\n", "0123456789abcdef0123456789abcdef", ""},
		{"short\n", "", "5 bytes, want at least 16"},
		{"0123456789abcdef 0123456789abcdef", "", "printable ASCII"},
	} {
		p := filepath.Join(dir, "secret")
		if err := os.WriteFile(p, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSecret(p)
		if c.err == "" && (err != nil || string(got) != c.want) {
			t.Errorf("ReadSecret(%q) = %q, %v", c.content, got, err)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "0123456789abcdef")) {
			t.Errorf("ReadSecret(%q): %v, want an error with %q that does not show the secret", c.content, err, c.err)
		}
	}
	if _, err := ReadSecret(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file: no error")
	}
}
