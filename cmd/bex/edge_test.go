package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// lockedBuffer is bex edge's stderr, read by the test while the edge writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestEdgeLimitsAndShutdown runs bex edge (HTTP only) with its limits set by
// flags: a request with headers over --max-header-bytes gets 431, an app slower
// than --backend-timeout gets 504 at that bound; then a request in flight when the
// edge is told to stop still gets its whole answer, and bex edge returns cleanly.
func TestEdgeLimitsAndShutdown(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "edge-cmd")
	ctx := context.Background()

	released := make(chan struct{})
	arrived := make(chan struct{}, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow": // slower than --backend-timeout: this wait is the slowness under test
			select {
			case <-time.After(10 * time.Second):
			case <-r.Context().Done():
			}
		case "/long": // in flight across the shutdown
			arrived <- struct{}{}
			<-released
			io.WriteString(w, "finished after the shutdown began")
		default:
			io.WriteString(w, "hi")
		}
	}))
	t.Cleanup(backend.Close)
	routeWeb(t, ctx, cp, ns, backend.Listener.Addr())

	var stderr lockedBuffer
	ready := make(chan string, 1)
	ed := &edgeCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil)), ready: ready,
		reg: prometheus.NewRegistry()} // the deployer's test runs another edge in this process
	cmd := wire(ed)
	cmd.SetArgs([]string{"--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--state-dir", t.TempDir(),
		"--http-addr", "127.0.0.1:0", "--https-addr", "",
		"--backend-timeout", "300ms", "--max-header-bytes", "4096", "--shutdown-timeout", "20s"})
	edgeCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(edgeCtx) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("bex edge: %v\n%s", err, stderr.String())
	}

	client := &http.Client{Timeout: 30 * time.Second}
	get := func(path string, hdr http.Header) (int, string, error) {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Host = "web.localhost"
		for k, v := range hdr {
			req.Header[k] = v
		}
		res, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		return res.StatusCode, string(body), err
	}
	testenv.Eventually(t, 20*time.Second, "web.localhost routed", func() error {
		if status, _, err := get("/", nil); err != nil || status != 200 {
			return fmt.Errorf("%d %v\n%s", status, err, stderr.String())
		}
		return nil
	})

	// net/http allows 4 KiB of slack over MaxHeaderBytes; 16 KiB is over it either way.
	if status, body, err := get("/", http.Header{"X-Big": {strings.Repeat("x", 16<<10)}}); err != nil || status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB of headers with --max-header-bytes 4096: %d %q %v, want 431", status, body, err)
	}
	start := time.Now()
	status, body, err := get("/slow", nil)
	if took := time.Since(start); err != nil || status != http.StatusGatewayTimeout || took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("slow app with --backend-timeout 300ms: %d %q %v after %s, want 504 after about 300ms", status, body, err, took)
	}

	// Shutdown while a request is in flight.
	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		s, b, err := get("/long", nil)
		inflight <- result{s, b, err}
	}()
	<-arrived
	stop()
	// The listener closes at once: a new connection is refused while the request
	// in flight is still being answered.
	testenv.Eventually(t, 10*time.Second, "the edge's listener closed after it was told to stop", func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil
		}
		c.Close()
		return errors.New("a new connection is accepted")
	})
	select {
	case err := <-done:
		t.Fatalf("bex edge returned (%v) with a request in flight", err)
	default:
	}
	close(released)
	r := <-inflight
	if r.err != nil || r.status != 200 || r.body != "finished after the shutdown began" {
		t.Fatalf("request in flight across the shutdown: %d %q %v", r.status, r.body, r.err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bex edge ended with %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bex edge did not return after its last request finished")
	}
	if !strings.Contains(stderr.String(), "draining requests in flight") {
		t.Errorf("the log does not say the edge drained:\n%s", stderr.String())
	}
}

// TestEdgeNamesEveryBadFlag: bad flags are refused together, each by its name,
// before the API is dialled.
func TestEdgeNamesEveryBadFlag(t *testing.T) {
	_, err := runBex(t, "edge", "--kubeconfig", t.TempDir()+"/none", "--dial-timeout", "0s", "--max-header-bytes", "10", "--trusted-proxies", "10.0.0.0/8,lb.example")
	for _, want := range []string{"--dial-timeout 0s", "--max-header-bytes 10", `--trusted-proxies: "lb.example" is neither a CIDR`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bex edge with bad flags: %v, want it to name %s", err, want)
		}
	}
}

// routeWeb makes the app web in ns and an EndpointSlice that sends its
// requests to addr, a server of the test's on loopback, as the deployer's
// would to an instance.
func routeWeb(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, ns string, addr net.Addr) {
	t.Helper()
	_, portStr, _ := net.SplitHostPort(addr.String())
	port, _ := strconv.Atoi(portStr)
	if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	name, proto, p := "http", corev1.ProtocolTCP, int32(port)
	if err := cp.Client.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeFQDN,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &p}},
	}); err != nil {
		t.Fatal(err)
	}
}
