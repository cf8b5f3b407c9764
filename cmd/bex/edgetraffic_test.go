package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/edge"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

// TestEdgeTrafficClient reads the edge's real stats handler, served as bex edge
// --stats-addr unix:PATH serves it without HTTPS, through the gitserver's
// client: the figures, the certificates (none), the edge's refusals, and
// errors that say the figures cannot be read.
func TestEdgeTrafficClient(t *testing.T) {
	proxy, err := edge.NewProxy(edge.DefaultConfig(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "edge-stats.sock")
	// A socket left by a killed edge is replaced.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err := listenStats("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the socket: %v %v, want a socket of mode 0600", fi, err)
	}
	srv := &http.Server{Handler: edge.StatsHandler(proxy, nil)}
	go srv.Serve(l)
	defer srv.Close()

	c, err := newEdgeTraffic("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	var _ backend.Traffic = c
	var _ backend.Certificates = c
	ctx := context.Background()
	got, err := c.AppTraffic(ctx, "web", 5*time.Minute, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := []backend.TrafficWindow{{Window: 5 * time.Minute, Minutes: 5}, {Window: time.Hour, Minutes: 60}, {Window: time.Minute, Minutes: 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("an app without requests: %+v, want %+v", got, want)
	}
	if got, err := c.AppTraffic(ctx, "web"); err != nil || len(got) != 0 {
		t.Errorf("no window: %v %v, want none", got, err)
	}
	for _, bad := range []struct {
		app     string
		windows []time.Duration
		reason  string
	}{
		{"Web", []time.Duration{time.Hour}, "only a-z, 0-9 and -"},
		{"a/b", []time.Duration{time.Hour}, "only a-z, 0-9 and -"},
		{"web", []time.Duration{90 * time.Second}, `window "1m30s": give whole minutes`},
		{"web", []time.Duration{2 * time.Hour}, `window "120m": give whole minutes`},
		{"web", []time.Duration{1, 2, 3, 4, 5}, "5 windows: ask for at most 4"},
	} {
		_, err := c.AppTraffic(ctx, bad.app, bad.windows...)
		if err == nil || !strings.Contains(err.Error(), "400 Bad Request: ") || !strings.Contains(err.Error(), bad.reason) {
			t.Errorf("%q %v: %v, want the edge's 400 saying %q", bad.app, bad.windows, err, bad.reason)
		}
	}

	if got, err := c.AppCertificates(ctx, "web"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("certificates of an edge without HTTPS: %#v %v, want an empty list", got, err)
	}
	for _, app := range []string{"Web", "a/b"} {
		if _, err := c.AppCertificates(ctx, app); err == nil || !strings.Contains(err.Error(), "400 Bad Request: app name") {
			t.Errorf("certificates of %q: %v, want the edge's 400", app, err)
		}
	}

	// The edge gone: its socket removed with its listener.
	srv.Close()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlives its listener: %v", err)
	}
	if _, err := c.AppTraffic(ctx, "web", time.Hour); err == nil || !strings.Contains(err.Error(), "the edge's stats cannot be read") {
		t.Errorf("no edge: %v, want an error saying its stats cannot be read", err)
	}
	if _, err := c.AppCertificates(ctx, "web"); err == nil || !strings.Contains(err.Error(), "the edge's stats cannot be read") {
		t.Errorf("certificates, no edge: %v, want an error saying its stats cannot be read", err)
	}

	// An edge that accepts and never answers costs the caller 2 seconds.
	hung, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	// Both reads at once: each waits out the timeout.
	var wg sync.WaitGroup
	for what, read := range map[string]func() error{
		"figures":      func() error { _, err := c.AppTraffic(ctx, "web", time.Hour); return err },
		"certificates": func() error { _, err := c.AppCertificates(ctx, "web"); return err },
	} {
		wg.Go(func() {
			start := time.Now()
			err := read()
			if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "the edge's stats cannot be read") || took > 5*time.Second {
				t.Errorf("%s of a stuck edge: %v after %s, want an error after %s", what, err, took, edgeTrafficTimeout)
			}
		})
	}
	wg.Wait()

	for _, addr := range []string{"unix:", "localhost", "127.0.0.1:"} {
		if _, err := newEdgeTraffic(addr); err == nil {
			t.Errorf("--edge-stats %q accepted", addr)
		}
	}
	if tr, err := edgeTrafficFrom(""); tr != nil || err != nil {
		t.Errorf("--edge-stats empty: %v %v, want no Traffic", tr, err)
	}
	if cs, err := edgeCertificatesFrom(""); cs != nil || err != nil {
		t.Errorf("--edge-stats empty: %v %v, want no Certificates", cs, err)
	}
	if cs, err := edgeCertificatesFrom("unix:" + sock); cs == nil || err != nil {
		t.Errorf("--edge-stats unix:PATH: %v %v, want Certificates", cs, err)
	}
}

// TestEdgeStatsSocket runs bex edge with --stats-addr unix:PATH in front of an
// app and reads what it answered through the gitserver's client.
func TestEdgeStatsSocket(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "edge-stats")
	ctx := context.Background()
	backendSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "hi")
	}))
	t.Cleanup(backendSrv.Close)
	routeWeb(t, ctx, cp, ns, backendSrv.Listener.Addr())

	sock := filepath.Join(t.TempDir(), "edge-stats.sock")
	addr := runEdge(t, ctx, "--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--state-dir", t.TempDir(),
		"--http-addr", "127.0.0.1:0", "--https-addr", "", "--stats-addr", "unix:"+sock)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the stats socket: %v %v, want mode 0600", fi, err)
	}

	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	// What the edge counts for web: every answer but those given before it
	// knew web (counted for no app); its 503s while web had no instance yet are
	// web's.
	var counted, failed int64
	get := func(path string) (int, error) {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Host = "web.localhost"
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return 0, err
		}
		if bytes.Contains(body, []byte("The edge is starting")) || bytes.Contains(body, []byte("No app answers")) {
			return res.StatusCode, nil
		}
		counted++
		if res.StatusCode >= 500 {
			failed++
		}
		return res.StatusCode, nil
	}
	testenv.Eventually(t, 20*time.Second, "web.localhost routed", func() error {
		if status, err := get("/"); err != nil || status != 200 {
			return fmt.Errorf("%d %v", status, err)
		}
		return nil
	})
	for range 3 {
		if status, err := get("/"); err != nil || status != 200 {
			t.Fatalf("GET /: %d %v", status, err)
		}
	}
	for range 2 {
		if status, err := get("/fail"); err != nil || status != 500 {
			t.Fatalf("GET /fail: %d %v", status, err)
		}
	}
	c, err := newEdgeTraffic("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	// The edge counts a request once its answer is sent: the client may have
	// read it a moment before.
	var got []backend.TrafficWindow
	testenv.Eventually(t, 10*time.Second, "every answer counted", func() error {
		if got, err = c.AppTraffic(ctx, "web", 5*time.Minute, time.Hour); err != nil {
			return err
		}
		if got[1].Requests < counted {
			return fmt.Errorf("%d requests counted, want %d", got[1].Requests, counted)
		}
		return nil
	})
	for i, w := range got {
		if w.Requests != counted || w.Status5xx != failed || w.Status4xx != 0 || w.Window != []time.Duration{5 * time.Minute, time.Hour}[i] ||
			w.P50 <= 0 || w.P95 < w.P50 || w.P95 > 60 {
			t.Errorf("window %d: %+v, want %d requests, %d 5xx, no 4xx, quantiles", i, w, counted, failed)
		}
	}
}

// TestEdgeStatsCertificates runs bex edge with HTTPS from its local CA and
// --stats-addr unix:PATH, and reads an app's certificate state through the
// gitserver's client: its exact hosts get theirs ahead of time (valid, from
// the local CA), its wildcard domain stays none; and a handshake for a name
// under the wildcard adds that name, valid.
func TestEdgeStatsCertificates(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "edge-certs")
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appv1.AppSpec{Domains: []string{"www.example.com", "*.apps.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	httpsPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	state, sock := t.TempDir(), filepath.Join(t.TempDir(), "edge-stats.sock")
	runEdge(t, ctx, "--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--state-dir", state,
		"--http-addr", "127.0.0.1:0", "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort), "--stats-addr", "unix:"+sock)
	ca, err := edge.LoadOrCreateLocalCA(filepath.Join(state, "edge", "ca")) // the edge's, made at its start
	if err != nil {
		t.Fatal(err)
	}
	c, err := edgeCertificatesFrom("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	// check waits until the hosts are those of want, with their states.
	check := func(what string, want map[string]string) []backend.CertificateState {
		var got []backend.CertificateState
		testenv.Eventually(t, 30*time.Second, what, func() error {
			if got, err = c.AppCertificates(ctx, "web"); err != nil {
				return err
			}
			if len(got) != len(want) {
				return fmt.Errorf("%+v", got)
			}
			for _, s := range got {
				if want[s.Host] != s.State {
					return fmt.Errorf("%+v", got)
				}
			}
			return nil
		})
		return got
	}
	got := check("web's exact hosts certified ahead of time", map[string]string{
		"web.localhost": "valid", "www.example.com": "valid", "*.apps.example.com": "none"})
	if got[0].Host != "web.localhost" {
		t.Errorf("hosts in the order %+v, want web.localhost first", got)
	}
	for _, s := range got {
		notAfter, err := time.Parse(time.RFC3339, s.NotAfter)
		if s.State == "valid" && (s.Issuer != ca.IssuerKey() || err != nil || time.Until(notAfter) < edge.CertLifetime-time.Hour) {
			t.Errorf("%s: %+v, want issued by %s for %s", s.Host, s, ca.IssuerKey(), edge.CertLifetime)
		}
		if s.State == "none" && (s.Issuer != "" || s.NotAfter != "") {
			t.Errorf("%s: %+v, want no issuer nor date", s.Host, s)
		}
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", fmt.Sprintf("127.0.0.1:%d", httpsPort),
		&tls.Config{ServerName: "a.apps.example.com", RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake for a.apps.example.com: %v", err)
	}
	conn.Close()
	check("a name under the wildcard, certified at its handshake", map[string]string{
		"web.localhost": "valid", "www.example.com": "valid", "*.apps.example.com": "none", "a.apps.example.com": "valid"})
	if got, err := c.AppCertificates(ctx, "nobody"); err != nil || len(got) != 0 {
		t.Errorf("an app the edge routes no host for: %+v %v, want none", got, err)
	}
}

// runEdge runs `bex edge args...` in this process until the test ends (its
// error, if any, fails the test then) and returns its HTTP address once it
// serves.
func runEdge(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	var stderr lockedBuffer
	ready := make(chan string, 1)
	ed := &edgeCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil)), ready: ready,
		reg: prometheus.NewRegistry()} // other tests run edges in this process
	cmd := wire(ed)
	cmd.SetArgs(args)
	edgeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(edgeCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("bex edge: %v\n%s", err, stderr.String())
		}
	})
	select {
	case addr := <-ready:
		return addr
	case err := <-done:
		done <- nil // said here; the cleanup has nothing to wait for
		t.Fatalf("bex edge: %v\n%s", err, stderr.String())
		return ""
	}
}
