package edge

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/testenv"
)

// BenchmarkProxyToNamespace measures the edge's requests per second to a backend
// in a network namespace of its own on the apps' network (a veth pair, routed by
// the host, through bex's filter chains and conntrack: where an instance of the
// local runtime listens) beside the same edge to the same backend on the host's
// loopback (where instances listened before they had namespaces), in one run,
// the targets taking turns as in BenchmarkProxy. Each edge is a process of its
// own (the test binary again); the backends are one Go HTTP handler in this
// process, its listener opened inside the namespace. Also reported: the same pair
// without the edge (direct), to tell the network's cost from the proxy's, and the
// CPU time per request of this process and the edge's, steadier than the rates on
// a shared machine.
func BenchmarkProxyToNamespace(b *testing.B) {
	dir := b.TempDir()
	ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
	if err != nil {
		b.Fatal(err)
	}
	certPEM, keyPEM := issueFromLocalCA(b, ca, benchHost)
	for name, data := range map[string][]byte{"cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	hostBackend := serveBench(b, ok, nil)
	nsBackend := serveInNamespace(b, ok)

	edgeFor := func(name, backend string) (string, *testenv.Helper) {
		addrs := loopbackAddrs(b, 5)
		proc, err := testenv.StartHelper(filepath.Join(dir, name), "edge", []string{
			benchEdgeEnv + "=" + dir, "BEX_BENCH_BACKEND=" + backend, "BEX_BENCH_LISTEN=" + strings.Join(addrs, ","),
		}, addrs...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = proc.Stop() })
		return addrs[0], proc
	}
	edgeHost, hostProc := edgeFor("edge-host", hostBackend)
	edgeNetns, netnsProc := edgeFor("edge-netns", nsBackend)
	f := &benchFixture{roots: x509.NewCertPool()}
	targets := []*benchTarget{
		f.target("edge-host", "http", edgeHost, ""),
		f.target("edge-netns", "http", edgeNetns, ""),
		f.target("direct-host", "http", hostBackend, ""),
		f.target("direct-netns", "http", nsBackend, ""),
	}
	targets[0].proxy, targets[1].proxy = hostProc.CPUTime, netnsProc.CPUTime
	for _, t := range targets {
		t.load(b, benchWarmup, nil)
		defer t.client.CloseIdleConnections()
	}
	for b.Loop() {
		for range benchRounds {
			for _, t := range targets {
				t.load(b, benchSlice, t)
			}
		}
	}
	for _, t := range targets {
		p50, p99 := t.percentiles()
		b.ReportMetric(t.rate(), t.name+"-req/s")
		b.ReportMetric(float64(p50.Microseconds()), t.name+"-p50-us")
		b.ReportMetric(float64(p99.Microseconds()), t.name+"-p99-us")
		// CPU per request of this process (client and backend) and the edge's:
		// unlike the rates, it does not move when other work takes the cores.
		b.ReportMetric(float64((t.cpu+t.proxyCPU).Microseconds())/float64(t.requests), t.name+"-cpu-us/req")
	}
	b.ReportMetric(targets[1].rate()/targets[0].rate(), "edge-netns/edge-host")
	b.ReportMetric(targets[3].rate()/targets[2].rate(), "direct-netns/direct-host")
	b.ReportMetric(0, "ns/op")
}

// serveInNamespace serves h in a network namespace attached to the apps' network
// and returns its address:port.
func serveInNamespace(b *testing.B, h http.Handler) string {
	b.Helper()
	ctx := context.Background()
	cfg := tenantnet.Config{}
	if err := tenantnet.Install(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	n, err := tenantnet.NewAppsNetwork(cfg)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "netns")
	if err := tenantnet.NewNetNS(path); err != nil {
		b.Fatal(err)
	}
	id := fmt.Sprintf("edge-bench-%d", time.Now().UnixNano())
	addr, err := n.Attach(ctx, id, path)
	if err != nil {
		_ = tenantnet.RemoveNetNS(path)
		b.Fatal(err)
	}
	var l net.Listener
	err = tenantnet.InNetNS(path, func() error {
		var err error
		l, err = net.Listen("tcp4", net.JoinHostPort(addr.String(), "0"))
		return err
	})
	srv := &http.Server{Handler: h, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	b.Cleanup(func() {
		srv.Close()
		_ = n.Detach(ctx, id, path)
		_ = tenantnet.RemoveNetNS(path)
	})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	return l.Addr().String()
}
