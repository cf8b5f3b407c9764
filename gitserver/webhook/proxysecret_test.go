package webhook

import (
	"maps"
	"net/http"
	"strconv"
	"testing"

	"bex.co/bex/internal/clientaddr"
)

// TestTheEdgesSecretNamesTheSource: on a cluster the edge reaches the
// gitserver from an address no list can tell from a tenant's pod's, and
// vouches for its X-Forwarded-For with the proxy secret instead. With the
// secret, each client behind the edge has a bucket of its own; without it, or
// with a wrong one, a peer that names a new client each time is still counted
// under its own address.
func TestTheEdgesSecretNamesTheSource(t *testing.T) {
	edgeSecret := []byte("0123456789abcdef0123456789abcdef")
	cfg := DefaultConfig()
	cfg.ProxySecret = edgeSecret
	f := newFixture(t, cfg, &fakeRedeployer{})
	good := push("refs/heads/main", commit(1))
	bad := map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": "x", HeaderGitHubSignature: Sign([]byte("guess"), []byte(good))}
	with := func(proxySecret string) map[string]string {
		h := maps.Clone(bad)
		if proxySecret != "" {
			h[clientaddr.HeaderProxySecret] = proxySecret
		}
		return h
	}
	const edge = "10.244.0.1:40000" // not in TrustedProxies: 127.0.0.1 and ::1
	for i := range 10 {
		if w := f.postFrom(edge, "203.0.113.1", "shop", good, with(string(edgeSecret))); w.Code != http.StatusUnauthorized {
			t.Fatalf("through the edge, bad signature %d: %d, want 401", i+1, w.Code)
		}
	}
	if w := f.postFrom(edge, "203.0.113.1", "shop", good, with(string(edgeSecret))); w.Code != http.StatusTooManyRequests {
		t.Fatalf("through the edge, 11th bad signature: %d, want 429", w.Code)
	}
	// Another client through the same edge is not limited with the first.
	if w := f.postFrom(edge, "203.0.113.2", "shop", good, with(string(edgeSecret))); w.Code != http.StatusUnauthorized {
		t.Fatalf("another client through the edge: %d, want 401", w.Code)
	}

	// A tenant's pod calling the gitserver directly, forging X-Forwarded-For
	// anew each time, without the secret or with a guess: its own address.
	for _, c := range []struct{ name, peer, secret string }{
		{"no secret", "10.244.0.7:5000", ""},
		{"a wrong secret", "10.244.0.8:5000", "0123456789abcdef0123456789abcdeX"},
	} {
		for i := range 10 {
			if w := f.postFrom(c.peer, "198.51.100."+strconv.Itoa(i+1), "shop", good, with(c.secret)); w.Code != http.StatusUnauthorized {
				t.Fatalf("%s, bad signature %d: %d, want 401", c.name, i+1, w.Code)
			}
		}
		if w := f.postFrom(c.peer, "198.51.100.99", "shop", good, with(c.secret)); w.Code != http.StatusTooManyRequests {
			t.Fatalf("%s, with a new X-Forwarded-For each time: %d, want 429", c.name, w.Code)
		}
	}
	// Control: the edge's own address (had it been counted as one source, the
	// first client's 429 would be everyone's) and a well-signed delivery from a
	// limited source still go through.
	if w := f.postFrom(edge, "", "shop", good, bad); w.Code != http.StatusUnauthorized {
		t.Fatalf("the edge's address itself: %d, want 401", w.Code)
	}
	if w := f.postFrom(edge, "203.0.113.1", "shop", good, map[string]string{
		"X-GitHub-Event": "push", "X-GitHub-Delivery": "ok-1", HeaderGitHubSignature: Sign(secret, []byte(good)), clientaddr.HeaderProxySecret: string(edgeSecret),
	}); w.Code != http.StatusAccepted {
		t.Fatalf("a good delivery from a limited client: %d %s", w.Code, w.Body.String())
	}
}

func TestProxySecretIsChecked(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ProxySecret = []byte("short")
	if err := cfg.Validate(); err == nil {
		t.Fatal("a 5-byte proxy secret: no error")
	}
}
