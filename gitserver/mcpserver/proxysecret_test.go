package mcpserver_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/clientaddr"
)

// TestTheEdgesSecretNamesTheSource: the failed tokens of a client behind the
// edge count under the client the edge names when the edge sends the proxy
// secret (a cluster, where its address is no better than a pod's); a peer
// without it, or with a wrong one, is counted under its own address however
// it fills X-Forwarded-For.
func TestTheEdgesSecretNamesTheSource(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	fc := fake.NewClientBuilder().WithScheme(s).Build()
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Namespace, bcfg.Releases, bcfg.Tokens = fc, "apps", noReleases{}, &tokens.Store{Client: fc, Users: fc, Namespace: "bex-system"}
	b, err := backend.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	edgeSecret := "0123456789abcdef0123456789abcdef"
	cfg := mcpserver.DefaultConfig()
	cfg.Backend, cfg.ProxySecret = b, []byte(edgeSecret)
	cfg.TrustedProxies, _ = clientaddr.Parse("127.0.0.1,::1")
	srv, err := mcpserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	// call sends a malformed token (refused without a read) from peer.
	call := func(peer, xff, secret string) int {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(initialize))
		r.RemoteAddr = peer
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Authorization", "Bearer bex_short")
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		if secret != "" {
			r.Header.Set(clientaddr.HeaderProxySecret, secret)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	burst := cfg.FailedTokens.Burst
	const edge = "10.244.0.1:40000"
	for i := range burst {
		if code := call(edge, "203.0.113.1", edgeSecret); code != http.StatusUnauthorized {
			t.Fatalf("through the edge, bad token %d: %d, want 401", i+1, code)
		}
	}
	if code := call(edge, "203.0.113.1", edgeSecret); code != http.StatusTooManyRequests {
		t.Fatalf("through the edge, past the burst: %d, want 429", code)
	}
	// Another client through the same edge is not limited with the first.
	if code := call(edge, "203.0.113.2", edgeSecret); code != http.StatusUnauthorized {
		t.Fatalf("another client through the edge: %d, want 401", code)
	}
	// A tenant's pod at the gitserver directly, naming a new client each time.
	for _, c := range []struct{ name, peer, secret string }{
		{"no secret", "10.244.0.7:5000", ""},
		{"a wrong secret", "10.244.0.8:5000", "0123456789abcdef0123456789abcdeX"},
	} {
		for i := range burst {
			if code := call(c.peer, "198.51.100."+strconv.Itoa(i+1), c.secret); code != http.StatusUnauthorized {
				t.Fatalf("%s, bad token %d: %d, want 401", c.name, i+1, code)
			}
		}
		if code := call(c.peer, "198.51.100.99", c.secret); code != http.StatusTooManyRequests {
			t.Fatalf("%s, with a new X-Forwarded-For each time: %d, want 429", c.name, code)
		}
	}
	// A trusted address (the edge under `bex up`) needs no secret: the client
	// it names is the one limited above.
	if code := call("127.0.0.1:40000", "203.0.113.1", ""); code != http.StatusTooManyRequests {
		t.Fatalf("the limited client behind the loopback edge: %d, want 429", code)
	}
}

func TestProxySecretIsChecked(t *testing.T) {
	cfg := mcpserver.DefaultConfig()
	cfg.Backend, cfg.ProxySecret = &backend.Backend{}, []byte("short")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.ProxySecret") {
		t.Fatalf("a 5-byte proxy secret: %v", err)
	}
}
