package edge

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/clientaddr"
	"bex.co/bex/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
)

// headerRecorder is a backend that keeps the headers of the last request it got.
type headerRecorder struct {
	mu   sync.Mutex
	last http.Header
	n    int
}

func (h *headerRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h.mu.Lock()
	h.last, h.n = r.Header.Clone(), h.n+1
	h.mu.Unlock()
	io.WriteString(w, "ok")
}

func (h *headerRecorder) got(t *testing.T, n int) http.Header {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n != n {
		t.Fatalf("the backend got %d requests, want %d", h.n, n)
	}
	return h.last
}

// proxySecretEdge serves an edge over HTTP with the app web (its backend app)
// and bex's own endpoints on localhost (platform), the platform's requests
// sent with secret when it is not empty.
func proxySecretEdge(t *testing.T, secret string) (addr string, web, platform *headerRecorder, log *testenv.SyncBuffer) {
	t.Helper()
	web, platform = &headerRecorder{}, &headerRecorder{}
	appSrv, platformSrv := httptest.NewServer(web), httptest.NewServer(platform)
	t.Cleanup(appSrv.Close)
	t.Cleanup(platformSrv.Close)
	cfg := Config{PlatformBackend: platformSrv.Listener.Addr().String()}
	if secret != "" {
		cfg.PlatformSecret = []byte(secret)
	}
	cfg = cfg.withDefaults()
	s, _ := build("localhost", []appv1.App{app("web")}, []discoveryv1.EndpointSlice{
		slice("web", discoveryv1.AddressTypeFQDN, int32(port(t, appSrv.Listener.Addr())), ep(nil, "127.0.0.1")),
	})
	s.exact[cfg.PlatformHost] = Route{App: PlatformApp, Platform: true, Backends: []string{cfg.PlatformBackend}, next: new(atomic.Uint64)}
	table := &Table{}
	table.cur.Store(s)
	log = &testenv.SyncBuffer{}
	p, err := NewProxy(cfg, table, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, p, nil), web, platform, log
}

// send makes one request to the edge at addr with a client's own copy of the
// proxy secret's header (none if forged is empty) and a forged
// X-Forwarded-For.
func send(t *testing.T, addr, method, host, path, forged string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, _ := http.NewRequest(method, "http://"+addr+path, body)
	req.Host = host
	if forged != "" {
		req.Header.Set(clientaddr.HeaderProxySecret, forged)
	}
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{}).DialContext}}
	defer c.CloseIdleConnections()
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s %s%s: %d", method, host, path, res.StatusCode)
	}
}

// TestProxySecretOnlyToThePlatform: the edge sends its proxy secret to bex's
// own endpoints, with the client it saw in X-Forwarded-For, and to nothing
// else; a client's own copy of the header reaches no backend, an app's (in the
// fast lane or through net/http) or the platform's; and the secret is not in
// the edge's log.
func TestProxySecretOnlyToThePlatform(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	addr, web, platform, log := proxySecretEdge(t, secret)

	send(t, addr, http.MethodGet, "web.localhost", "/", secret) // the lane
	if v, ok := web.got(t, 1)[clientaddr.HeaderProxySecret]; ok {
		t.Errorf("an app (the lane) got the client's %s %q", clientaddr.HeaderProxySecret, v)
	}
	send(t, addr, http.MethodPost, "web.localhost", "/", secret) // net/http's Rewrite
	if v, ok := web.got(t, 2)[clientaddr.HeaderProxySecret]; ok {
		t.Errorf("an app (through net/http) got the client's %s %q", clientaddr.HeaderProxySecret, v)
	}
	send(t, addr, http.MethodPost, "localhost", "/mcp", "forged-by-the-client")
	h := platform.got(t, 1)
	if got := h.Values(clientaddr.HeaderProxySecret); len(got) != 1 || got[0] != secret {
		t.Errorf("the platform got %s %q, want the edge's secret alone", clientaddr.HeaderProxySecret, got)
	}
	if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("the platform got X-Forwarded-For %q, want the client the edge saw", got)
	}
	send(t, addr, http.MethodGet, "localhost", "/hooks/web", "")
	if got := platform.got(t, 2).Values(clientaddr.HeaderProxySecret); len(got) != 1 || got[0] != secret {
		t.Errorf("a webhook request: the platform got %q, want the edge's secret", got)
	}
	if strings.Contains(log.String(), secret) {
		t.Errorf("the edge's log shows the secret:\n%s", log)
	}
	if !strings.Contains(log.String(), "path=/mcp") {
		t.Errorf("no access log line for /mcp (the log checked is not the edge's):\n%s", log)
	}

	// Without a secret of its own, the edge passes on none: the client's is
	// dropped on the way to the platform too.
	addr, _, platform, _ = proxySecretEdge(t, "")
	send(t, addr, http.MethodPost, "localhost", "/mcp", secret)
	if v, ok := platform.got(t, 1)[clientaddr.HeaderProxySecret]; ok {
		t.Errorf("without a secret, the platform got the client's %q", v)
	}
}

func TestPlatformSecretIsChecked(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{PlatformBackend: "127.0.0.1:8090", PlatformSecret: []byte("short")}, "Config.PlatformSecret: 5 bytes"},
		{Config{PlatformSecret: []byte("0123456789abcdef0123456789abcdef")}, "without PlatformBackend"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate: %v, want %q", err, c.want)
		}
	}
}
