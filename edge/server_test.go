package edge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// laneFixture is a Server for the app "web" (web.localhost) in front of one
// backend, on plain HTTP and on HTTPS with the local CA, and what the backend
// saw.
type laneFixture struct {
	proxy       *Proxy
	http, https string // host:port
	roots       *x509.CertPool
	caPEM       []byte
	log         *testenv.SyncBuffer

	mu   sync.Mutex
	seen []*http.Request // as the backend received them
}

func newLaneFixture(t *testing.T, backend http.HandlerFunc) *laneFixture {
	t.Helper()
	return newLaneFixtureWith(t, Config{}, backend)
}

func newLaneFixtureWith(t *testing.T, cfg Config, backend http.HandlerFunc) *laneFixture {
	t.Helper()
	f := &laneFixture{log: &testenv.SyncBuffer{}}
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r)
		f.mu.Unlock()
		backend(w, r)
	}))
	t.Cleanup(be.Close)
	table := staticTable("localhost", []appv1.App{app("web")}, []discoveryv1.EndpointSlice{
		slice("web", discoveryv1.AddressTypeFQDN, int32(port(t, be.Listener.Addr())), ep(nil, "127.0.0.1")),
	})
	log := slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := NewProxy(cfg, table, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	f.proxy = p
	dir := t.TempDir()
	ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := NewCertificates(table, FileStorage(filepath.Join(dir, "certificates")), ca, nil, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.roots = x509.NewCertPool()
	f.roots.AppendCertsFromPEM(ca.CertPEM())
	f.caPEM = ca.CertPEM()
	f.http = serve(t, p, nil)
	f.https = serve(t, p, certs.TLSConfig())
	return f
}

func (f *laneFixture) last(t *testing.T) *http.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		t.Fatal("the backend saw no request")
	}
	return f.seen[len(f.seen)-1]
}

func (f *laneFixture) handoffs() float64 { return testutil.ToFloat64(f.proxy.m.handoffs) }

// sendRaw dials addr and writes raw, with a deadline of d for the whole
// exchange; the caller closes the connection.
func sendRaw(t *testing.T, addr, raw string, d time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c, raw); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// rawExchange writes raw on one connection to addr and reads n responses.
func rawExchange(t *testing.T, addr, raw string, n int) []*http.Response {
	t.Helper()
	c := sendRaw(t, addr, raw, 10*time.Second)
	defer c.Close()
	br := bufio.NewReader(c)
	var out []*http.Response
	for i := range n {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d of %d: %v", i+1, n, err)
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("response %d body: %v", i+1, err)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		out = append(out, res)
	}
	return out
}

func bodyOf(res *http.Response) string {
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func echoMethodAndBody(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), b)
}

// TestLaneAndHandover: on one kept-alive connection, GETs taken by the lane and a
// request with a body that is not: from that request on, net/http serves the
// connection, and every answer comes back in order.
func TestLaneAndHandover(t *testing.T) {
	f := newLaneFixture(t, echoMethodAndBody)
	raw := "GET /one?a=1 HTTP/1.1\r\nHost: web.localhost\r\n\r\n" +
		"GET /two HTTP/1.1\r\nHost: web.localhost\r\n\r\n" + // pipelined
		"POST /three HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 5\r\n\r\nhello" +
		"GET /four HTTP/1.1\r\nHost: web.localhost\r\n\r\n"
	want := []string{"GET /one?a=1 ", "GET /two ", "POST /three hello", "GET /four "}
	for i, res := range rawExchange(t, f.http, raw, len(want)) {
		if got := bodyOf(res); res.StatusCode != 200 || got != want[i] {
			t.Errorf("response %d: %d %q, want 200 %q", i+1, res.StatusCode, got, want[i])
		}
	}
	if got := f.handoffs(); got != 1 {
		t.Errorf("%v handoffs, want 1 (at the POST)", got)
	}
}

// TestLaneHandsOverWhatItDoesNotServe: every kind of request the lane leaves to
// net/http is answered as net/http answers it, bad ones included.
func TestLaneHandsOverWhatItDoesNotServe(t *testing.T) {
	f := newLaneFixture(t, echoMethodAndBody)
	cases := []struct {
		name, raw string
		status    int
		body      string
	}{
		{"HTTP/1.0", "GET /old HTTP/1.0\r\nHost: web.localhost\r\n\r\n", 200, "GET /old "},
		{"Content-Length on a GET", "GET /cl HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 3\r\n\r\nabc", 200, "GET /cl abc"},
		{"chunked GET", "GET /te HTTP/1.1\r\nHost: web.localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 200, "GET /te abc"},
		{"head over 4 KiB", "GET /big HTTP/1.1\r\nHost: web.localhost\r\nX-Big: " + strings.Repeat("x", 5000) + "\r\n\r\n", 200, "GET /big "},
		{"bare LF", "GET /lf HTTP/1.1\nHost: web.localhost\n\n", 200, "GET /lf "},
		{"semicolon in query", "GET /q?a=1;b=2 HTTP/1.1\r\nHost: web.localhost\r\n\r\n", 200, "GET /q "}, // ReverseProxy drops the parameter
		{"Connection: close", "GET /close HTTP/1.1\r\nHost: web.localhost\r\nConnection: close\r\n\r\n", 200, "GET /close "},
		{"unknown host", "GET / HTTP/1.1\r\nHost: nope.localhost\r\n\r\n", 404, "No app answers at nope.localhost"},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: web.localhost\r\nHost: web.localhost\r\n\r\n", 400, ""},
		{"bad header name", "GET / HTTP/1.1\r\nHost: web.localhost\r\nBad Name: x\r\n\r\n", 400, ""},
		{"absolute form", "GET http://web.localhost/abs HTTP/1.1\r\nHost: web.localhost\r\n\r\n", 200, "GET /abs "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.handoffs()
			res := rawExchange(t, f.http, c.raw, 1)[0]
			if got := bodyOf(res); res.StatusCode != c.status || !strings.Contains(got, c.body) {
				t.Errorf("%d %q, want %d containing %q", res.StatusCode, got, c.status, c.body)
			}
			if f.handoffs() != before+1 {
				t.Errorf("not handed over")
			}
		})
	}
}

// TestLaneRequestAndResponse: what the backend gets from the lane and what the
// client gets back, header by header, as ReverseProxy and the http.Server would
// have made them.
func TestLaneRequestAndResponse(t *testing.T) {
	f := newLaneFixture(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/untyped":
			w.Header()["Date"] = nil // let the edge add it
			io.WriteString(w, "<html><body>hi</body></html>")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/chunked":
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("Connection", "X-Private")
			w.Header().Set("X-Private", "hop-by-hop")
			io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
			w.Header().Set("X-Sum", "42")
		default:
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "hello")
		}
	})
	client := &http.Client{Transport: &http.Transport{}}
	get := func(method, path string, hdr http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+f.http+path, nil)
		req.Host = "web.localhost"
		for k, v := range hdr {
			req.Header[k] = v
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(body))
		return res
	}

	res := get("GET", "/plain", http.Header{
		"X-Forwarded-For": {"6.6.6.6"}, "Forwarded": {"for=6.6.6.6"}, "X-Forwarded-Host": {"evil"},
		HeaderRequestID: {"client-id-1"}, "Accept": {"text/plain"},
		"X-Real-Ip": {"6.6.6.6"}, "True-Client-Ip": {"6.6.6.6"}, "X-Client-Ip": {"6.6.6.6"}, "Cf-Connecting-Ip": {"6.6.6.6"},
		"X_real_ip": {"6.6.6.6"}, "X_forwarded_for": {"6.6.6.6"},
	})
	in := f.last(t)
	for k, want := range map[string]string{
		"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": "web.localhost", "X-Forwarded-Proto": "http",
		HeaderRequestID: "client-id-1", "Forwarded": "", "User-Agent": "Go-http-client/1.1", "Accept": "text/plain",
		"X-Real-Ip": "127.0.0.1", "True-Client-Ip": "", "X-Client-Ip": "", "Cf-Connecting-Ip": "", "X_real_ip": "", "X_forwarded_for": "",
	} {
		if got := strings.Join(in.Header[k], ","); got != want {
			t.Errorf("backend got %s %q, want %q", k, got, want)
		}
	}
	if in.Host != "web.localhost" {
		t.Errorf("backend got Host %q", in.Host)
	}
	if res.StatusCode != 200 || bodyOf(res) != "hello" || res.Header.Get(HeaderRequestID) != "client-id-1" ||
		res.ContentLength != 5 || res.Header.Get("Date") == "" {
		t.Errorf("GET /plain: %d %v", res.StatusCode, res.Header)
	}

	res = get("GET", "/untyped", nil)
	if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" || res.Header.Get("Date") == "" {
		t.Errorf("untyped response: Content-Type %q, Date %q: want them sniffed and added", ct, res.Header.Get("Date"))
	}

	res = get("HEAD", "/plain", nil)
	if res.StatusCode != 200 || res.ContentLength != 5 || bodyOf(res) != "" {
		t.Errorf("HEAD: %d, length %d", res.StatusCode, res.ContentLength)
	}

	res = get("GET", "/empty", nil)
	if res.StatusCode != 204 || bodyOf(res) != "" {
		t.Errorf("204: %d %q", res.StatusCode, bodyOf(res))
	}

	res = get("GET", "/chunked", nil)
	if got := bodyOf(res); got != "part one, part two" || res.ContentLength != -1 ||
		res.Trailer.Get("X-Sum") != "42" || res.Header.Get("X-Private") != "" {
		t.Errorf("chunked: %q, length %d, trailer %v, header %v", got, res.ContentLength, res.Trailer, res.Header)
	}
	if f.handoffs() != 0 {
		t.Errorf("%v handoffs, want every request in the lane", f.handoffs())
	}
}

// TestLaneOverTLS: HTTP/1.1 over TLS goes through the lane, HTTP/2 is handed to
// net/http at once, and a request handed over mid-connection still counts as
// HTTPS for the backend.
func TestLaneOverTLS(t *testing.T) {
	f := newLaneFixture(t, echoMethodAndBody)
	tc := &tls.Config{RootCAs: f.roots, ServerName: "web.localhost"}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DialContext: dialTo(f.https)}}
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DialContext: dialTo(f.https), ForceAttemptHTTP2: true}}
	for _, c := range []struct {
		name     string
		client   *http.Client
		method   string
		proto    string
		handoffs float64
	}{
		{"HTTP/1.1 GET", h1, "GET", "HTTP/1.1", 0},
		{"HTTP/1.1 POST", h1, "POST", "HTTP/1.1", 1},
		{"HTTP/2 GET", h2, "GET", "HTTP/2.0", 2},
	} {
		var body io.Reader
		if c.method == "POST" {
			body = strings.NewReader("data")
		}
		req, _ := http.NewRequest(c.method, "https://web.localhost/x", body)
		res, err := c.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Proto != c.proto {
			t.Errorf("%s: %d over %s", c.name, res.StatusCode, res.Proto)
		}
		if got := f.last(t).Header.Get("X-Forwarded-Proto"); got != "https" {
			t.Errorf("%s: backend got X-Forwarded-Proto %q", c.name, got)
		}
		if f.handoffs() != c.handoffs {
			t.Errorf("%s: %v handoffs, want %v", c.name, f.handoffs(), c.handoffs)
		}
	}
}

func dialTo(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// TestLaneShutdown: Shutdown closes idle lane connections at once, lets a request
// in flight finish, and returns when it has.
func TestLaneShutdown(t *testing.T) {
	release := make(chan struct{})
	f := newLaneFixture(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "done")
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := f.proxy.NewServer(nil)
	go srv.Serve(l)

	idle, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
	br := bufio.NewReader(idle)
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
		t.Fatalf("first request: %v", err)
	}
	io.Copy(io.Discard, io.LimitReader(br, 4))

	busy, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
	testenv.Eventually(t, 10*time.Second, "slow request at the backend", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.seen) != 2 {
			return fmt.Errorf("%d requests seen", len(f.seen))
		}
		return nil
	})

	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("idle connection during shutdown: read %d, %v; want it closed (EOF)", n, err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(100 * time.Millisecond): // no wait: a bound on a negative (Shutdown has not returned), which a correct server always passes
	}
	close(release)
	busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil || res.StatusCode != 200 || bodyOf(res) != "done" {
		t.Fatalf("request in flight during shutdown: %v", err)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last request")
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Error("still accepting after Shutdown")
	}
}

// TestWriteRequest: the lane's request writer and Request.Write put the same
// request on the wire, as the backend's parser reads it; what the writer does
// not take plainly it leaves to Request.Write.
func TestWriteRequest(t *testing.T) {
	for _, c := range []struct {
		method, url, host string
		header            http.Header
	}{
		{"GET", "http://10.0.0.1:8080/path?q=1&r=%20", "app.example.com", http.Header{"Accept": {"*/*"}, "X-Multi": {"a", "b"}}},
		{"HEAD", "http://10.0.0.1:8080/", "app.example.com:8443", http.Header{"User-Agent": {""}}},
		{"GET", "http://10.0.0.1:8080/%7Euser/a%2Fb", "", http.Header{"User-Agent": {"curl/8"}}},
		{"GET", "http://10.0.0.1:8080/", "h", http.Header{"X-Space": {" padded "}}}, // Request.Write trims
		{"GET", "http://10.0.0.1:8080/", "h", http.Header{"X-Bad": {"a\r\nInjected: 1"}}},
		{"DELETE", "http://10.0.0.1:8080/x", "h", nil},
	} {
		req, err := http.NewRequest(c.method, c.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = c.host
		for k, v := range c.header {
			req.Header[k] = v
		}
		var fast, std bytes.Buffer
		bw := bufio.NewWriter(&fast)
		if err := writeRequest(bw, req); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		if err := req.Write(&std); err != nil {
			t.Fatal(err)
		}
		a, errA := http.ReadRequest(bufio.NewReader(&fast))
		b, errB := http.ReadRequest(bufio.NewReader(&std))
		if errA != nil || errB != nil {
			t.Fatalf("%s %s: parse: %v / %v", c.method, c.url, errA, errB)
		}
		if a.Method != b.Method || a.RequestURI != b.RequestURI || a.Host != b.Host ||
			fmt.Sprint(a.Header) != fmt.Sprint(b.Header) || a.ContentLength != b.ContentLength {
			t.Errorf("%s %s:\nwriteRequest  %s %s %s %v %d\nRequest.Write %s %s %s %v %d", c.method, c.url,
				a.Method, a.RequestURI, a.Host, a.Header, a.ContentLength, b.Method, b.RequestURI, b.Host, b.Header, b.ContentLength)
		}
	}
}

// TestLanePanicEndsOnlyItsConnection: a panic in the lane (here: a Proxy without a
// table) closes that connection and is logged; the Server goes on accepting.
func TestLanePanicEndsOnlyItsConnection(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	p, err := NewProxy(Config{}, nil, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p, nil)
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("the Server stopped accepting: %v", err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n")
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("read %d, %v: want the connection closed", n, err)
		}
		c.Close()
	}
	// The client sees the close before the server's deferred bookkeeping has
	// run: wait for the gauge, the event itself.
	testenv.Eventually(t, 5*time.Second, "the panicked connections released", func() error {
		if n := testutil.ToFloat64(p.m.connections); n != 0 {
			return fmt.Errorf("connections %v", n)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "panic serving a connection") {
		t.Errorf("log:\n%s", logs.String())
	}
}
