package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchEdgeEnv) != "" {
		os.Exit(runBenchEdge()) // the benchmark's edge process, not a test run
	}
	os.Exit(testenv.Run(m))
}

type env struct {
	t      *testing.T
	ns     string
	kube   client.Client
	table  *Table
	proxy  *Proxy
	url    string // the proxy's base URL
	addr   string // the proxy's host:port
	client *http.Client
	log    *testenv.SyncBuffer
	reg    *prometheus.Registry
}

// newEnv starts a cache, table and proxy on a fresh namespace, in the documented
// order: cache.New, NewTable (informers registered), cache start, proxy.
func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "edge")
	cfg.Namespace = ns
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme,
		DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	table, err := NewTable(ctx, cfg, c, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache: %v", err)
		}
	})
	reg := prometheus.NewRegistry()
	p, err := NewProxy(cfg, table, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p, nil)
	e := &env{t: t, ns: ns, kube: cp.Client, table: table, proxy: p, url: "http://" + addr,
		addr: addr, log: logs, reg: reg,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}}
	t.Cleanup(e.client.CloseIdleConnections)
	testenv.Eventually(t, 10*time.Second, "table ready", func() error {
		if !table.Ready() {
			return errors.New("not ready")
		}
		return nil
	})
	return e
}

// serve serves p on a loopback port with its Server (the fast lane and net/http
// behind it), over TLS when tc is set, and returns host:port.
func serve(t testing.TB, p *Proxy, tc *tls.Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l = p.ProxyProtocol(l) // as cmd/bex wraps it: under TLS; l itself without trusted proxies
	if tc != nil {
		l = tls.NewListener(l, tc)
	}
	srv := p.NewServer(tc)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return addr
}

// known checks that the table knows host.
func (e *env) known(host string) func() error {
	return func() error {
		if !e.table.Known(host) {
			return fmt.Errorf("%s not in the table", host)
		}
		return nil
	}
}

// status checks that host's / answers with code.
func (e *env) status(host string, code int) func() error {
	return func() error {
		if r := e.get(host); r.status != code {
			return fmt.Errorf("%s answers %d %q", host, r.status, r.body)
		}
		return nil
	}
}

// atLeast checks that f counts n or more.
func atLeast[N int | int64](f func() N, n N) func() error {
	return func() error {
		if got := f(); got < n {
			return fmt.Errorf("%d, want %d", got, n)
		}
		return nil
	}
}

// logged checks that the access log has a line containing each of lines.
func (e *env) logged(lines ...string) func() error {
	return func() error {
		for _, l := range lines {
			if !strings.Contains(e.log.String(), l) {
				return fmt.Errorf("no %q in the log", l)
			}
		}
		return nil
	}
}

func (e *env) createApp(name string, mutate func(*appv1.App)) *appv1.App {
	e.t.Helper()
	a := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}
	if mutate != nil {
		mutate(a)
	}
	if err := e.kube.Create(context.Background(), a); err != nil {
		e.t.Fatalf("create app %s: %v", name, err)
	}
	return a
}

// createSlice publishes backends of app at 127.0.0.1:<port> as the local runtime
// does: FQDN slices, one per instance.
func (e *env) createSlice(app, name string, ready *bool, ports ...int) *discoveryv1.EndpointSlice {
	e.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: app}},
		AddressType: discoveryv1.AddressTypeFQDN,
	}
	if len(ports) != 1 {
		e.t.Fatal("one port per slice")
	}
	s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"},
		Conditions: discoveryv1.EndpointConditions{Ready: ready}}}
	s.Ports = []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(ports[0]))}}
	if err := e.kube.Create(context.Background(), s); err != nil {
		e.t.Fatalf("create slice %s: %v", name, err)
	}
	return s
}

// waitBackends waits until host routes to exactly n backends.
func (e *env) waitBackends(host string, n int) {
	e.t.Helper()
	testenv.Eventually(e.t, 10*time.Second, fmt.Sprintf("%s with %d backends", host, n), func() error {
		if r, ok := e.table.Lookup(host); !ok || len(r.Backends) != n {
			return fmt.Errorf("backends %v", r.Backends)
		}
		return nil
	})
}

type resp struct {
	status int
	body   string
	header http.Header
}

func (e *env) do(method, host, path string, body io.Reader, hdr map[string]string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{res.StatusCode, string(b), res.Header}
}

func (e *env) get(host string) resp { e.t.Helper(); return e.do("GET", host, "/", nil, nil) }

func expect(t *testing.T, what string, r resp, status int, body string) {
	t.Helper()
	if r.status != status || !strings.Contains(r.body, body) {
		t.Errorf("%s: %d %q; want %d containing %q", what, r.status, r.body, status, body)
	}
}

// backend is a real HTTP server on 127.0.0.1 answering its name.
func backend(t *testing.T, name string) (*httptest.Server, int) {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name)
	}))
	t.Cleanup(s.Close)
	return s, port(t, s.Listener.Addr())
}

func port(t testing.TB, a net.Addr) int {
	t.Helper()
	_, p, err := net.SplitHostPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// closedPort returns a loopback port that refuses connections.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := port(t, l.Addr())
	l.Close()
	return p
}

func TestRouting(t *testing.T) {
	e := newEnv(t, Config{})
	_, webPort := backend(t, "web says hi")
	_, shopPort := backend(t, "shop says hi")
	_, flakyPort := backend(t, "flaky ok")

	e.createApp("web", nil)
	e.createSlice("web", "web-1", ptr(true), webPort)
	e.createApp("shop", func(a *appv1.App) { a.Spec.Domains = []string{"shop.example.com", "*.stores.example.com"} })
	e.createSlice("shop", "shop-1", nil, shopPort) // ready nil counts as ready
	e.createApp("sleepy", func(a *appv1.App) { a.Spec.Suspended = true })
	e.createSlice("sleepy", "sleepy-1", ptr(true), webPort)
	e.createApp("empty", nil)
	e.createSlice("empty", "empty-1", ptr(false), webPort) // not ready: not a backend
	e.createApp("flaky", nil)
	e.createSlice("flaky", "flaky-1", ptr(true), closedPort(t))
	e.createSlice("flaky", "flaky-2", ptr(true), flakyPort)
	e.createApp("dead", nil)
	e.createSlice("dead", "dead-1", ptr(true), closedPort(t))
	e.createSlice("dead", "dead-2", ptr(true), closedPort(t))
	for host, n := range map[string]int{"web.localhost": 1, "shop.localhost": 1, "sleepy.localhost": 1,
		"empty.localhost": 0, "flaky.localhost": 2, "dead.localhost": 2} {
		e.waitBackends(host, n)
	}

	expect(t, "default host", e.get("web.localhost"), 200, "web says hi")
	expect(t, "host with port, any case", e.get("WEB.localhost:8080"), 200, "web says hi")
	expect(t, "custom domain", e.get("shop.example.com"), 200, "shop says hi")
	expect(t, "wildcard domain", e.get("paris.stores.example.com"), 200, "shop says hi")
	expect(t, "wildcard is one label", e.get("a.b.stores.example.com"), 404, "No app answers at a.b.stores.example.com")
	expect(t, "unknown host", e.get("nope.localhost"), 404, "No app answers at nope.localhost.")
	expect(t, "suspended", e.get("sleepy.localhost"), 503, "sleepy is suspended")
	expect(t, "no ready backend", e.get("empty.localhost"), 503, "empty has no running instance right now")
	r := e.do("GET", "nope.localhost", "/", nil, map[string]string{"Accept": "text/html"})
	if r.status != 404 || !strings.Contains(r.body, "<h1>No such app</h1>") || r.header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Errorf("HTML 404: %d %q %v", r.status, r.body, r.header)
	}
	// Round-robin lands on the refusing backend every other request: each of those
	// must be retried on the other one.
	for i := range 6 {
		expect(t, fmt.Sprintf("refused, retried (%d)", i), e.get("flaky.localhost"), 200, "flaky ok")
		expect(t, fmt.Sprintf("DELETE refused, retried (%d)", i), e.do("DELETE", "flaky.localhost", "/", nil, nil), 200, "flaky ok")
	}
	// A POST is not replayed: over two requests one hits the refusing backend.
	var posts []int
	for range 2 {
		posts = append(posts, e.do("POST", "flaky.localhost", "/", strings.NewReader("x"), nil).status)
	}
	if (posts[0] == 502) == (posts[1] == 502) {
		t.Errorf("POST statuses %v: want exactly one 502 (no retry of a POST)", posts)
	}
	expect(t, "all refusing", e.get("dead.localhost"), 502, "dead could not be reached")

	if got := e.metric("bex_edge_requests_total", "web", "200"); got != 2 {
		t.Errorf("bex_edge_requests_total{app=web,code=200} = %v, want 2", got)
	}
	if got := e.metric("bex_edge_requests_total", "", "404"); got < 1 {
		t.Errorf("bex_edge_requests_total{app=\"\",code=404} = %v", got)
	}
}

func TestBackendTimeout(t *testing.T) {
	e := newEnv(t, Config{ResponseHeaderTimeout: 200 * time.Millisecond})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(10 * time.Second): // no wait: the slowness under test
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	e.createApp("slow", nil)
	e.createSlice("slow", "slow-1", ptr(true), port(t, slow.Listener.Addr()))
	e.waitBackends("slow.localhost", 1)
	start := time.Now()
	expect(t, "slow backend", e.get("slow.localhost"), 504, "slow did not answer in time")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("504 took %s", d)
	}

	// A client that gives up first gets nothing, and the log says 499.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/gone", nil)
	req.Host = "slow.localhost"
	if res, err := e.client.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("client deadline passed, yet got %d", res.StatusCode)
	}
	testenv.Eventually(t, 10*time.Second, "499 in the access log", e.logged("path=/gone status=499"))
}

// TestSwitch moves an app from release N to N+1 the way the runtime does (new
// slice, then delete the old one; the old instance runs on a while) under a request
// loop, and expects no failed request.
func TestSwitch(t *testing.T) {
	e := newEnv(t, Config{})
	oldSrv, oldPort := backend(t, "release 1")
	_, newPort := backend(t, "release 2")
	e.createApp("sw", nil)
	old := e.createSlice("sw", "sw-1", ptr(true), oldPort)
	e.waitBackends("sw.localhost", 1)

	var (
		mu       sync.Mutex
		seen     []string
		failures []string
		after    atomic.Int64 // responses since the old slice left the table
	)
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequest("GET", e.url, nil)
			req.Host = "sw.localhost"
			res, err := e.client.Do(req)
			var body string
			if err == nil {
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				body = string(b)
				if res.StatusCode != 200 {
					err = fmt.Errorf("status %d: %s", res.StatusCode, b)
				}
			}
			mu.Lock()
			if err != nil {
				failures = append(failures, err.Error())
			} else {
				seen = append(seen, body)
			}
			mu.Unlock()
			after.Add(1)
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) + len(failures) }
	testenv.Eventually(t, 10*time.Second, "requests on release 1", atLeast(count, 50))

	e.createSlice("sw", "sw-2", ptr(true), newPort)
	e.waitBackends("sw.localhost", 2)
	if err := e.kube.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "old slice gone from the table", func() error {
		if r, _ := e.table.Lookup("sw.localhost"); len(r.Backends) != 1 || r.Backends[0] != net.JoinHostPort("127.0.0.1", strconv.Itoa(newPort)) {
			return fmt.Errorf("backends %v", r.Backends)
		}
		return nil
	})
	after.Store(0)
	testenv.Eventually(t, 10*time.Second, "requests after the switch", atLeast(after.Load, 50))
	oldSrv.Close() // the drain period ends only after the delete
	testenv.Eventually(t, 10*time.Second, "requests with the old backend stopped", atLeast(after.Load, 100))
	close(stop)
	<-loopDone

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d failed requests, first: %s", len(failures), failures[0])
	}
	if seen[0] != "release 1" || seen[len(seen)-1] != "release 2" {
		t.Fatalf("responses went from %q to %q", seen[0], seen[len(seen)-1])
	}
	for _, s := range seen[len(seen)-50:] {
		if s != "release 2" {
			t.Fatalf("release 1 answered after it was stopped")
		}
	}
	t.Logf("%d requests, none failed", len(seen))
}

func TestFollowsAPI(t *testing.T) {
	e := newEnv(t, Config{})
	_, p := backend(t, "late one")
	expect(t, "before the app exists", e.get("late.localhost"), 404, "No app answers at late.localhost")
	a := e.createApp("late", nil)
	e.createSlice("late", "late-1", ptr(true), p)
	testenv.Eventually(t, 10*time.Second, "late app routed", e.status("late.localhost", 200))
	expect(t, "late app", e.get("late.localhost"), 200, "late one")
	if !e.table.Known("LATE.localhost") || e.table.Known("other.localhost") {
		t.Error("Known disagrees with the table")
	}
	if err := e.kube.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "deleted app gone", e.status("late.localhost", 404))
}

func TestStreams(t *testing.T) {
	e := newEnv(t, Config{})
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the client closes
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: second\n\n")
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprint(w, n)
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderRequestID, "the app's own id") // the edge's id wins
		json.NewEncoder(w).Encode(map[string]string{
			"for": r.Header.Get("X-Forwarded-For"), "proto": r.Header.Get("X-Forwarded-Proto"),
			"host": r.Header.Get("X-Forwarded-Host"), "id": r.Header.Get(HeaderRequestID), "Host": r.Host,
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	e.createApp("st", nil)
	e.createSlice("st", "st-1", ptr(true), port(t, srv.Listener.Addr()))
	e.waitBackends("st.localhost", 1)

	t.Run("websocket", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: st.localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get(HeaderRequestID) == "" {
			t.Fatalf("upgrade: %d %v", res.StatusCode, res.Header)
		}
		for _, msg := range []string{"hello\n", "again\n"} {
			io.WriteString(conn, msg)
			got, err := br.ReadString('\n')
			if err != nil || got != msg {
				t.Fatalf("echo: %q %v, want %q", got, err, msg)
			}
		}
	})

	t.Run("sse", func(t *testing.T) {
		req, _ := http.NewRequest("GET", e.url+"/events", nil)
		req.Host = "st.localhost"
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := e.client.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		// The backend has not finished (it waits on release): this line can only
		// arrive if the edge flushed it at once.
		line, err := br.ReadString('\n')
		if err != nil || line != "data: first\n" {
			t.Fatalf("first event: %q %v", line, err)
		}
		close(release)
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "\ndata: second\n\n" {
			t.Fatalf("rest: %q %v", rest, err)
		}
	})

	t.Run("upload 100MB", func(t *testing.T) {
		const size = 100 << 20
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		req, _ := http.NewRequest("POST", e.url+"/upload", io.LimitReader(zeros{}, size))
		req.Host = "st.localhost"
		req.ContentLength = size
		res, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		runtime.ReadMemStats(&after)
		if res.StatusCode != 200 || string(b) != strconv.Itoa(size) {
			t.Fatalf("upload: %d %q", res.StatusCode, b)
		}
		// Streamed, the whole round trip (client, edge, backend, all in this process)
		// allocates a few buffers; buffered, it would allocate the 100 MB at least once.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/2 {
			t.Errorf("uploading 100 MB allocated %d MB: the body is buffered", alloc>>20)
		}
		if got := e.metric("bex_edge_request_bytes_total", "st"); got < size {
			t.Errorf("request bytes metric = %v", got)
		}
	})

	t.Run("headers", func(t *testing.T) {
		var seen map[string]string
		r := e.do("GET", "st.localhost", "/headers", nil, map[string]string{HeaderRequestID: "abc-123"})
		if err := json.Unmarshal([]byte(r.body), &seen); err != nil {
			t.Fatal(err)
		}
		if seen["for"] != "127.0.0.1" || seen["proto"] != "http" || seen["host"] != "st.localhost" ||
			seen["Host"] != "st.localhost" || seen["id"] != "abc-123" {
			t.Errorf("backend saw %v", seen)
		}
		if got := r.header.Values(HeaderRequestID); len(got) != 1 || got[0] != "abc-123" {
			t.Errorf("response X-Request-Id = %q", got)
		}
		r = e.do("GET", "st.localhost", "/headers", nil, nil)
		seen = nil
		json.Unmarshal([]byte(r.body), &seen)
		if id := r.header.Get(HeaderRequestID); len(id) != 32 || seen["id"] != id {
			t.Errorf("made-up id: response %q, backend %q", id, seen["id"])
		}
		testenv.Eventually(t, 10*time.Second, "access log line", e.logged("request_id=abc-123", "method=GET host=st.localhost path=/headers status=200"))
	})
}

// metric reads a counter from the registry the proxy registered on, by its label
// values in order.
func (e *env) metric(name string, labels ...string) float64 {
	e.t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i, l := range m.GetLabel() {
				if i >= len(labels) || l.GetValue() != labels[i] {
					continue next
				}
			}
			return counterOf(m)
		}
	}
	return 0
}

func counterOf(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }
