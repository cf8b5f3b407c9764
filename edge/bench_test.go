package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/pki"
	"bex.co/bex/internal/testenv"
)

// Load shape: this many kept-alive connections (or handshake loops); each target
// warmed up once, then measured in every iteration for benchRounds slices of
// benchSlice, the targets taking turns. Short turns spread whatever else the
// machine does evenly over the targets, so the ratios stay fair on a busy machine.
const (
	benchConns  = 8
	benchWarmup = 300 * time.Millisecond
	benchSlice  = 250 * time.Millisecond
	benchRounds = 8
	benchHost   = "bench.localhost"
)

// BenchmarkProxy measures requests per second and p50/p99 latency on loopback for
// small responses over kept-alive HTTP/1.1 connections, for HTTP and HTTPS, in one
// run: straight to the backend, through the edge, and through nginx (Debian's
// package, proxy_pass with upstream keepalive) as the reference proxy. It reports
// each, and the ratios to direct: a proxy's cost is only comparable on the same
// machine and in the same minute.
//
// The load generator (net/http's client) and the backend share this process; the
// edge runs in a process of its own (this test binary started again, see
// runBenchEdge), as nginx does (one process), all on the machine's cores. The
// edge is measured twice: served by its Server (the fast lane), and served by a
// plain http.Server with the Proxy as handler ("edge-nethttp", what the lane
// saves). Both proxies write an access log line per request to a sink that
// discards it, so the formatting is paid as in production and the disk is not.
// The edge's HTTPS uses its real certmagic configuration with the local CA; the
// backend and nginx serve a certificate of the same CA and key type.
//
// Beside the rates it reports each target's CPU time per request, all processes
// together and the proxy's own process alone: unlike the rates, those do not move
// when other work on the machine takes cores away.
//
// Each iteration measures every target for benchRounds×benchSlice, so the numbers
// do not depend on b.N (`make bench` runs 3 iterations).
func BenchmarkProxy(b *testing.B) {
	f := newBenchFixture(b)
	for _, proto := range []string{"http", "https"} {
		b.Run(proto, func(b *testing.B) {
			edge := f.target("edge", proto, f.edgeHTTP, f.edgeHTTPS)
			edge.proxy = benchEdge.CPUTime
			netHTTP := f.target("edge-nethttp", proto, f.netHTTP, f.netHTTPS)
			netHTTP.proxy = benchEdge.CPUTime
			nginx := f.target("nginx", proto, f.nginxHTTP, f.nginxHTTPS)
			nginx.proxy = benchNginx.CPUTime
			caddy := f.target("caddy", proto, f.caddyHTTP, f.caddyHTTPS)
			caddy.proxy = benchCaddy.CPUTime
			targets := []*benchTarget{f.target("direct", proto, f.backendHTTP, f.backendHTTPS), edge, netHTTP, nginx, caddy}
			for _, t := range targets {
				t.load(b, benchWarmup, nil) // connections, certificate, pools
				defer t.client.CloseIdleConnections()
			}
			for b.Loop() {
				for range benchRounds {
					for _, t := range targets {
						t.load(b, benchSlice, t)
					}
				}
			}
			direct := targets[0].rate()
			for _, t := range targets {
				p50, p99 := t.percentiles()
				b.ReportMetric(t.rate(), t.name+"-req/s")
				b.ReportMetric(float64(p50.Microseconds()), t.name+"-p50-us")
				b.ReportMetric(float64(p99.Microseconds()), t.name+"-p99-us")
				b.ReportMetric(float64(t.cpu.Microseconds())/float64(t.requests), t.name+"-cpu-us/req")
				if t != targets[0] {
					b.ReportMetric(t.rate()/direct, t.name+"/direct")
					b.ReportMetric(float64(t.proxyCPU.Microseconds())/float64(t.requests), t.name+"-own-cpu-us/req")
				}
			}
			b.ReportMetric(float64(benchEdge.PeakRSS())/(1<<20), "edge-peak-rss-MiB")
			b.ReportMetric(0, "ns/op") // an iteration is a fixed window per target
		})
	}
}

// BenchmarkTLSHandshake measures new TLS 1.3 handshakes per second (X25519, no
// session resumption) with the edge's real certmagic configuration and a
// certificate of the local CA, beside a plain crypto/tls server with a certificate
// of the same key type (ECDSA P-256) in the edge's process, and beside Caddy with
// that certificate, in the same run. Each server runs in a process apart from the
// load generator (this one), whose CPU per handshake it reports too.
//
// The warm-up handshakes verify the chain to the local CA; the measured ones check
// only the handshake signature and that the leaf is the one the warm-up verified:
// chain verification is the client's cost, and on shared cores the load generator
// would otherwise spend most of the CPU that the servers are measured by.
func BenchmarkTLSHandshake(b *testing.B) {
	f := newBenchFixture(b)
	plain := &handshakeTarget{name: "plain", addr: f.plainHTTPS, server: benchEdge.CPUTime}
	edge := &handshakeTarget{name: "edge", addr: f.edgeHTTPS, server: benchEdge.CPUTime}
	caddy := &handshakeTarget{name: "caddy", addr: f.caddyHTTPS, server: benchCaddy.CPUTime}
	targets := []*handshakeTarget{plain, edge, caddy}
	for _, t := range targets {
		if err := t.pin(f.handshakeCfg); err != nil {
			b.Fatal(err)
		}
		t.load(b, benchWarmup)
		t.done, t.elapsed, t.serverCPU = 0, 0, 0
	}
	for b.Loop() {
		for range benchRounds {
			for _, t := range targets {
				t.load(b, benchSlice)
			}
		}
	}
	b.ReportMetric(plain.rate(), "plain-handshakes/s")
	b.ReportMetric(edge.rate(), "edge-handshakes/s")
	b.ReportMetric(caddy.rate(), "caddy-handshakes/s")
	b.ReportMetric(edge.rate()/plain.rate(), "edge/plain")
	b.ReportMetric(edge.rate()/caddy.rate(), "edge/caddy")
	for _, t := range targets {
		b.ReportMetric(float64(t.serverCPU.Microseconds())/float64(t.done), t.name+"-server-cpu-us/handshake")
	}
	b.ReportMetric(0, "ns/op")
}

// handshakeTarget is a TLS server under a load of new connections.
type handshakeTarget struct {
	name, addr string
	cfg        *tls.Config          // for the measured handshakes
	server     func() time.Duration // the server process's CPU time
	done       int64
	elapsed    time.Duration
	serverCPU  time.Duration
}

// pin makes one fully verified handshake, then sets up the measured ones to accept
// exactly the leaf certificate it got.
func (t *handshakeTarget) pin(verify *tls.Config) error {
	c, err := tls.Dial("tcp", t.addr, verify)
	if err != nil {
		return fmt.Errorf("%s: verified handshake: %w", t.name, err)
	}
	leaf := c.ConnectionState().PeerCertificates[0].Raw
	c.Close()
	t.cfg = verify.Clone()
	t.cfg.InsecureSkipVerify = true
	t.cfg.VerifyConnection = func(st tls.ConnectionState) error {
		switch {
		case !bytes.Equal(st.PeerCertificates[0].Raw, leaf):
			return errors.New("not the certificate the warm-up verified")
		case st.Version != tls.VersionTLS13 || st.CurveID != tls.X25519 || st.DidResume:
			return fmt.Errorf("version %x, curve %v, resumed %v: want TLS 1.3 with X25519, not resumed",
				st.Version, st.CurveID, st.DidResume)
		}
		return nil
	}
	return nil
}

// load runs benchConns loops of dial, handshake, close for d.
func (t *handshakeTarget) load(b *testing.B, d time.Duration) {
	var done atomic.Int64
	var wg sync.WaitGroup
	cpu0 := t.server()
	start := time.Now()
	stop := start.Add(d)
	for range benchConns {
		wg.Go(func() {
			for time.Now().Before(stop) {
				c, err := tls.Dial("tcp", t.addr, t.cfg)
				if err != nil {
					b.Errorf("%s: handshake: %v", t.name, err)
					return
				}
				c.Close()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	t.done += done.Load()
	t.elapsed += time.Since(start)
	t.serverCPU += t.server() - cpu0
}

func (t *handshakeTarget) rate() float64 { return float64(t.done) / t.elapsed.Seconds() }

// benchNginx and benchEdge are the running nginx and edge processes, whose CPU
// time cpuTime adds.
var (
	benchNginx *testenv.Nginx
	benchCaddy *testenv.Caddy
	benchEdge  *testenv.Helper
)

// benchEdgeEnv, in the test binary's environment, makes it the benchmark's edge
// process (runBenchEdge) instead of running tests. Its value is the fixture's
// directory: the local CA in ca/, and cert.pem and key.pem for the plain TLS
// server beside the edge. BEX_BENCH_BACKEND is the backend's address,
// BEX_BENCH_LISTEN the addresses of the edge's HTTP and HTTPS, of the plain TLS
// server, and of the edge's HTTP and HTTPS without the fast lane, comma-separated.
const benchEdgeEnv = "BEX_BENCH_EDGE"

// runBenchEdge serves the edge (its Server, a static table with the app "bench"
// on the backend, certificates from the local CA) and, for the handshake
// benchmark, a plain crypto/tls server in the same process, until SIGTERM.
func runBenchEdge() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "bench edge:", err)
		return 1
	}
	dir := os.Getenv(benchEdgeEnv)
	listen := strings.Split(os.Getenv("BEX_BENCH_LISTEN"), ",")
	backend, err := net.ResolveTCPAddr("tcp", os.Getenv("BEX_BENCH_BACKEND"))
	if err != nil || len(listen) != 5 {
		return fail(fmt.Errorf("want BEX_BENCH_BACKEND=host:port and five BEX_BENCH_LISTEN addresses (%v)", err))
	}
	ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
	if err != nil {
		return fail(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		return fail(err)
	}
	table := staticTable("localhost", []appv1.App{app("bench")}, []discoveryv1.EndpointSlice{
		// An instance's own address (IPv4), or 127.0.0.1 on the host network (FQDN,
		// as the local runtime writes it).
		backendSlice(backend),
	})
	// The access log in JSON, as on a cluster (BEX_LOG_FORMAT=json): formatted,
	// then dropped.
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	p, err := NewProxy(Config{}, table, log, nil)
	if err != nil {
		return fail(err)
	}
	certs, err := NewCertificates(table, FileStorage(filepath.Join(dir, "certificates")), ca, nil, log, nil)
	if err != nil {
		return fail(err)
	}
	var ls [5]net.Listener
	for i, a := range listen {
		if ls[i], err = net.Listen("tcp", a); err != nil {
			return fail(err)
		}
	}
	errc := make(chan error, 5)
	go func() { errc <- p.NewServer(nil).Serve(ls[0]) }()
	go func() { errc <- p.NewServer(certs.TLSConfig()).Serve(tls.NewListener(ls[1], certs.TLSConfig())) }()
	for i, tc := range map[int]*tls.Config{3: nil, 4: certs.TLSConfig()} {
		srv := &http.Server{Handler: p, TLSConfig: tc}
		p.ConfigureServer(srv)
		l := ls[i]
		if tc != nil {
			l = tls.NewListener(l, tc)
		}
		go func() { errc <- srv.Serve(l) }()
	}
	plain := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	go func() {
		errc <- plain.Serve(tls.NewListener(ls[2], &tls.Config{Certificates: []tls.Certificate{pair}}))
	}()
	// BEX_BENCH_EDGE_PROFILE=FILE: a CPU profile of the edge process, for the
	// whole run (go tool pprof FILE).
	if path := os.Getenv("BEX_BENCH_EDGE_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	select {
	case <-stop:
		return 0
	case err := <-errc:
		return fail(err)
	}
}

// benchFixture is a backend, the edge in front of it and nginx in front of it,
// each on HTTP and HTTPS, on loopback.
type benchFixture struct {
	roots                     *x509.CertPool
	backendHTTP, backendHTTPS string
	edgeHTTP, edgeHTTPS       string
	nginxHTTP, nginxHTTPS     string
	plainHTTPS                string // crypto/tls alone, in the edge's process
	netHTTP, netHTTPS         string // the edge without its fast lane
	caddyHTTP, caddyHTTPS     string
	handshakeCfg              *tls.Config
}

func newBenchFixture(b *testing.B) *benchFixture {
	b.Helper()
	dir := b.TempDir()
	ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
	if err != nil {
		b.Fatal(err)
	}
	f := &benchFixture{roots: x509.NewCertPool()}
	f.roots.AppendCertsFromPEM(ca.CertPEM())
	f.handshakeCfg = &tls.Config{
		RootCAs: f.roots, ServerName: benchHost,
		MinVersion: tls.VersionTLS13, MaxVersion: tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519},
	}

	// The backend's certificate (for direct HTTPS and nginx), from the same CA
	// and of the key type certmagic uses.
	certPEM, keyPEM := issueFromLocalCA(b, ca, benchHost)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		b.Fatal(err)
	}
	for name, data := range map[string][]byte{"cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}

	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	f.backendHTTP = serveBench(b, ok, nil)
	f.backendHTTPS = serveBench(b, ok, &tls.Config{Certificates: []tls.Certificate{pair}})

	// The edge runs in a process of its own, as in production and as nginx does
	// here: in this one it would share the Go runtime (scheduler, garbage
	// collector) with the load generator and the backend.
	edgeAddrs := loopbackAddrs(b, 5)
	f.edgeHTTP, f.edgeHTTPS, f.plainHTTPS, f.netHTTP, f.netHTTPS = edgeAddrs[0], edgeAddrs[1], edgeAddrs[2], edgeAddrs[3], edgeAddrs[4]
	edgeProc, err := testenv.StartHelper(filepath.Join(dir, "edge"), "edge", []string{
		benchEdgeEnv + "=" + dir, "BEX_BENCH_BACKEND=" + f.backendHTTP,
		"BEX_BENCH_LISTEN=" + strings.Join(edgeAddrs, ","),
	}, edgeAddrs...)
	if err != nil {
		b.Fatal(err)
	}
	keepRunning(b, &benchEdge, edgeProc)

	// nginx as a reverse proxy is usually set up: upstream keepalive (HTTP/1.1 and
	// no Connection header to the backend), the usual forwarded headers, an access
	// log in the default format.
	nginxAddrs := loopbackAddrs(b, 2)
	f.nginxHTTP, f.nginxHTTPS = nginxAddrs[0], nginxAddrs[1]
	ng, err := testenv.StartNginx(filepath.Join(dir, "nginx"), fmt.Sprintf(`
	access_log /dev/null combined;
	upstream bench {
		server %[1]s;
		keepalive 64;
	}
	server {
		listen %[2]s;
		listen %[3]s ssl;
		server_name %[4]s;
		ssl_certificate %[5]s/cert.pem;
		ssl_certificate_key %[5]s/key.pem;
		ssl_protocols TLSv1.2 TLSv1.3;
		ssl_ecdh_curve X25519:prime256v1;
		location / {
			proxy_pass http://bench;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $host;
			proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
			proxy_set_header X-Forwarded-Proto $scheme;
		}
	}`, f.backendHTTP, f.nginxHTTP, f.nginxHTTPS, benchHost, dir), f.nginxHTTP, f.nginxHTTPS)
	if err != nil {
		b.Fatal(err)
	}
	keepRunning(b, &benchNginx, ng)

	// Caddy as its documentation sets up a reverse proxy, with the same
	// certificate, an access log that is formatted and discarded, and no admin
	// endpoint or automatic HTTPS (nothing to reach from here).
	caddyAddrs := loopbackAddrs(b, 2)
	f.caddyHTTP, f.caddyHTTPS = caddyAddrs[0], caddyAddrs[1]
	cd, err := testenv.StartCaddy(filepath.Join(dir, "caddy"), fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
}
https://%[1]s:%[2]s {
	bind 127.0.0.1
	tls %[4]s/cert.pem %[4]s/key.pem
	reverse_proxy %[5]s
	log {
		output discard
	}
}
http://%[1]s:%[3]s {
	bind 127.0.0.1
	reverse_proxy %[5]s
	log {
		output discard
	}
}
`, benchHost, portOf(f.caddyHTTPS), portOf(f.caddyHTTP), dir, f.backendHTTP), caddyAddrs...)
	if err != nil {
		b.Fatal(err)
	}
	keepRunning(b, &benchCaddy, cd)
	return f
}

// backendSlice is the EndpointSlice of the bench app for backend, typed as the
// local runtime types it.
func backendSlice(backend *net.TCPAddr) discoveryv1.EndpointSlice {
	if backend.IP.IsLoopback() {
		return slice("bench", discoveryv1.AddressTypeFQDN, int32(backend.Port), ep(nil, "127.0.0.1"))
	}
	return slice("bench", discoveryv1.AddressTypeIPv4, int32(backend.Port), ep(nil, backend.IP.String()))
}

// keepRunning sets *global to server for the benchmark's cpuTime, and stops the
// server and clears *global at the benchmark's end.
func keepRunning[T interface{ Stop() error }](b *testing.B, global *T, server T) {
	*global = server
	b.Cleanup(func() {
		var none T
		*global = none
		if err := server.Stop(); err != nil {
			b.Error(err)
		}
	})
}

// loopbackAddrs returns n addresses 127.0.0.1:PORT with ports that were free a
// moment ago, for servers in other processes.
func loopbackAddrs(b *testing.B, n int) []string {
	b.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		p, err := testenv.FreePort()
		if err != nil {
			b.Fatal(err)
		}
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs
}

func portOf(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}

// serveBench serves h on a loopback port, over TLS when tc is set, and returns
// host:port.
func serveBench(b *testing.B, h http.Handler, tc *tls.Config) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: tc, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	if tc != nil {
		l = tls.NewListener(l, tc)
	}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

func tcpAddr(hostport string) net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", hostport)
	return a
}

// issueFromLocalCA makes an ECDSA P-256 key and a certificate for name.
func issueFromLocalCA(b *testing.B, ca *LocalCA, name string) (certPEM, keyPEM []byte) {
	b.Helper()
	key, err := pki.NewKey()
	if err != nil {
		b.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}}, key)
	if err != nil {
		b.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		b.Fatal(err)
	}
	issued, err := ca.Issue(context.Background(), csr)
	if err != nil {
		b.Fatal(err)
	}
	keyPEM, err = pki.EncodeKey(key)
	if err != nil {
		b.Fatal(err)
	}
	return issued.Certificate, keyPEM
}

// benchTarget is one server under load, and what was measured of it.
type benchTarget struct {
	name, url string
	client    *http.Client
	requests  int64
	elapsed   time.Duration
	cpu       time.Duration // every process's CPU time (cpuTime), while measured
	proxy     func() time.Duration
	proxyCPU  time.Duration // the proxy process's own CPU time, while measured
	latencies []time.Duration
}

func (f *benchFixture) target(name, proto, httpAddr, httpsAddr string) *benchTarget {
	tr := &http.Transport{MaxIdleConnsPerHost: benchConns, MaxConnsPerHost: benchConns}
	addr := httpAddr
	if proto == "https" {
		addr = httpsAddr
		// HTTP/1.1 over TLS for all three, so that only the proxies differ.
		tr.TLSClientConfig = &tls.Config{RootCAs: f.roots, ServerName: benchHost, MinVersion: tls.VersionTLS13}
	}
	return &benchTarget{name: name, url: proto + "://" + addr + "/", client: &http.Client{Transport: tr}}
}

// load runs benchConns request loops against t for d and, when into is set, adds
// the count, the time and every request's latency to it.
func (t *benchTarget) load(b *testing.B, d time.Duration, into *benchTarget) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	cpu0 := cpuTime(b)
	var proxy0 time.Duration
	if t.proxy != nil {
		proxy0 = t.proxy()
	}
	start := time.Now()
	stop := start.Add(d)
	for range benchConns {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<14)
			for {
				t0 := time.Now()
				if t0.After(stop) {
					break
				}
				req, _ := http.NewRequest("GET", t.url, nil)
				req.Host = benchHost
				res, err := t.client.Do(req)
				if err != nil {
					b.Errorf("%s: %v", t.name, err)
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Errorf("%s: status %d", t.name, res.StatusCode)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			if into != nil {
				into.requests += int64(len(lat))
				into.latencies = append(into.latencies, lat...)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if into != nil {
		into.elapsed += time.Since(start)
		into.cpu += cpuTime(b) - cpu0
		if t.proxy != nil {
			into.proxyCPU += t.proxy() - proxy0
		}
	}
}

// cpuTime is the CPU time used so far by this process and the nginx it started.
// Per request, it tells what each target costs whatever else the machine runs.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if benchNginx != nil {
		d += benchNginx.CPUTime()
	}
	if benchEdge != nil {
		d += benchEdge.CPUTime()
	}
	if benchCaddy != nil {
		d += benchCaddy.CPUTime()
	}
	return d
}

func (t *benchTarget) rate() float64 { return float64(t.requests) / t.elapsed.Seconds() }

func (t *benchTarget) percentiles() (p50, p99 time.Duration) {
	if len(t.latencies) == 0 {
		return 0, 0
	}
	slices.Sort(t.latencies)
	at := func(p float64) time.Duration { return t.latencies[int(p*float64(len(t.latencies)-1))] }
	return at(0.50), at(0.99)
}
