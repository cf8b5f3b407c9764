package edge

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// trafficFixture is a Proxy serving the app "web" (web.localhost), whose backend
// answers by path, and the app "down", whose one backend refuses connections.
type trafficFixture struct {
	proxy    *Proxy
	addr     string
	client   *http.Client
	now      atomic.Pointer[time.Time] // the rings' clock, when set
	answered requestLines
}

// requestLines receives the access log's request lines: the proxy writes one
// after counting the request, which the client may have read the answer of
// before.
type requestLines chan struct{}

func (h requestLines) Enabled(context.Context, slog.Level) bool { return true }
func (h requestLines) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h requestLines) WithGroup(string) slog.Handler            { return h }
func (h requestLines) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "request" {
		h <- struct{}{}
	}
	return nil
}

// slowDelay is how long the backend's /slow takes: inside the bucket
// (0.1, 0.25] of request_duration_seconds with room for a busy machine.
const slowDelay = 120 * time.Millisecond

func newTrafficFixture(t *testing.T, clock bool) *trafficFixture {
	t.Helper()
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/missing":
			http.NotFound(w, r)
		case "/fail":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "/slow":
			time.Sleep(slowDelay) // the latency being measured
			io.WriteString(w, "slow")
		default:
			io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(be.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := port(t, l.Addr())
	l.Close() // "down" is routed to a port nothing listens on: the edge answers 502
	table := staticTable("localhost", []appv1.App{app("web"), app("down")}, []discoveryv1.EndpointSlice{
		slice("web", discoveryv1.AddressTypeFQDN, int32(port(t, be.Listener.Addr())), ep(nil, "127.0.0.1")),
		slice("down", discoveryv1.AddressTypeFQDN, int32(closed), ep(nil, "127.0.0.1")),
	})
	f := &trafficFixture{answered: make(requestLines, 64)}
	p, err := NewProxy(Config{}, table, slog.New(f.answered), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	f.proxy = p
	if clock {
		t0 := time.Date(2030, 1, 2, 3, 4, 30, 0, time.UTC)
		f.now.Store(&t0)
		// Set before the proxy serves: the handlers read it.
		p.m.trafficClock = func() time.Time { return *f.now.Load() }
	}
	f.addr = serve(t, p, nil)
	f.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

func (f *trafficFixture) advance(d time.Duration) {
	t := f.now.Load().Add(d)
	f.now.Store(&t)
}

// get sends n requests for path to host, 4 at a time, checks their status and
// waits until the proxy has counted them.
func (f *trafficFixture) get(t *testing.T, host, path string, n, want int) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req, _ := http.NewRequest("GET", "http://"+f.addr+path, nil)
			req.Host = host
			res, err := f.client.Do(req)
			if err != nil {
				t.Errorf("GET %s%s: %v", host, path, err)
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != want {
				t.Errorf("GET %s%s: %d, want %d", host, path, res.StatusCode, want)
			}
		})
	}
	wg.Wait()
	for i := range n {
		select {
		case <-f.answered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s%s: %d of %d requests counted", host, path, i, n)
		}
	}
}

// TestTrafficCountsRequests drives the proxy with answers of known status and
// latency and reads them back as figures: counts by class, quantiles inside the
// buckets the latencies fall in, the same histogram as Prometheus'.
func TestTrafficCountsRequests(t *testing.T) {
	f := newTrafficFixture(t, false)
	f.get(t, "web.localhost", "/", 10, 200)
	f.get(t, "web.localhost", "/missing", 3, 404)
	f.get(t, "web.localhost", "/fail", 2, 500)
	f.get(t, "web.localhost", "/slow", 5, 200)
	f.get(t, "down.localhost", "/", 2, 502)
	f.get(t, "nobody.localhost", "/", 2, 404)

	got := f.proxy.AppTraffic("web", 5*time.Minute, 60*time.Minute)
	if len(got) != 2 {
		t.Fatalf("%d windows, want 2", len(got))
	}
	for i, w := range got {
		if w.Minutes != []int{5, 60}[i] || w.Requests != 20 || w.Status4xx != 3 || w.Status5xx != 2 {
			t.Errorf("web, window %d: %+v, want 20 requests, 3 4xx, 2 5xx", i, w)
		}
		// 15 of 20 answered at once, 5 after slowDelay: the median is among the
		// fast ones, the 95th percentile among the slow, in (0.1, 0.25].
		if w.P50 <= 0 || w.P50 > 0.1 {
			t.Errorf("web, window %d: p50 %v, want in (0, 0.1]", i, w.P50)
		}
		if w.P95 <= 0.1 || w.P95 > 0.25 {
			t.Errorf("web, window %d: p95 %v, want in (0.1, 0.25]", i, w.P95)
		}
	}
	// The ring's histogram is Prometheus' series, bucket for bucket.
	a := f.appTraffic(t, "web")
	s := a.sum(f.proxy.m.trafficNow(), TrafficMinutes)
	var m dto.Metric
	if err := f.proxy.m.duration.WithLabelValues("web").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	var below uint64
	for i, b := range m.GetHistogram().GetBucket() {
		if b.GetUpperBound() != durationBounds[i] || b.GetCumulativeCount()-below != s.hist[i] {
			t.Errorf("bucket le=%v: Prometheus %d, the ring %d (le=%v)", b.GetUpperBound(), b.GetCumulativeCount()-below, s.hist[i], durationBounds[i])
		}
		below = b.GetCumulativeCount()
	}

	if w := f.proxy.AppTraffic("down", time.Hour)[0]; w.Requests != 2 || w.Status5xx != 2 || w.Status4xx != 0 {
		t.Errorf("down: %+v, want 2 requests, 2 5xx (the edge's 502)", w)
	}
	for _, name := range []string{"nobody", "never-asked", ""} {
		if w := f.proxy.AppTraffic(name, time.Hour)[0]; w != (TrafficWindow{Minutes: 60}) {
			t.Errorf("%q: %+v, want zero figures", name, w)
		}
	}
	// The unknown host's requests have their Prometheus series, no ring.
	if am, ok := f.proxy.m.apps.Load(""); !ok || am.(*appMetrics).traffic != nil {
		t.Errorf("requests for no app: metrics %v, ring kept", ok)
	}
}

func (f *trafficFixture) appTraffic(t *testing.T, app string) *appTraffic {
	t.Helper()
	am, ok := f.proxy.m.apps.Load(app)
	if !ok || am.(*appMetrics).traffic == nil {
		t.Fatalf("no ring for %s", app)
	}
	return am.(*appMetrics).traffic
}

// TestTrafficWindows moves the rings' clock between requests: a window sums the
// minutes within it, the current one included, and a bucket an hour old is
// emptied for its new minute.
func TestTrafficWindows(t *testing.T) {
	f := newTrafficFixture(t, true)
	windows := []time.Duration{time.Minute, 5 * time.Minute, 60 * time.Minute}
	check := func(when string, want ...int64) {
		t.Helper()
		for i, w := range f.proxy.AppTraffic("web", windows...) {
			if w.Requests != want[i] || w.Minutes != int(windows[i]/time.Minute) {
				t.Errorf("%s: %dm window: %d requests, want %d", when, w.Minutes, w.Requests, want[i])
			}
		}
	}
	f.get(t, "web.localhost", "/", 3, 200) // minute 0
	check("minute 0", 3, 3, 3)
	f.advance(2 * time.Minute)
	f.get(t, "web.localhost", "/fail", 2, 500) // minute 2
	check("minute 2", 2, 5, 5)
	f.advance(4 * time.Minute) // minute 6: minute 2 is in the last 5, minute 0 is not
	check("minute 6", 0, 2, 5)
	f.advance(time.Minute) // minute 7: minute 2 is out of the last 5
	check("minute 7", 0, 0, 5)
	f.advance(53 * time.Minute) // minute 60: minute 0 is out of the last hour
	check("minute 60", 0, 0, 2)
	// Minute 60 takes minute 0's bucket, which starts again from zero.
	f.get(t, "web.localhost", "/missing", 4, 404)
	check("minute 60, after requests", 4, 4, 6)
	w := f.proxy.AppTraffic("web", time.Hour)[0]
	if w.Status4xx != 4 || w.Status5xx != 2 {
		t.Errorf("minute 60: %+v, want 4 4xx (minute 60), 2 5xx (minute 2)", w)
	}
	f.advance(2 * time.Minute) // minute 62: minute 2 is out of the last hour
	check("minute 62", 0, 4, 4)

	// A request of minute 0, whose bucket holds minute 60 now (the clock went
	// back an hour), does not erase the newer counts.
	a := f.appTraffic(t, "web")
	a.record(f.proxy.m.trafficNow()-62, 200, time.Millisecond)
	check("minute 62, after a request an hour late", 0, 4, 4)
	// Windows are whole minutes within an hour.
	for i, w := range f.proxy.AppTraffic("web", 0, 90*time.Second, 3*time.Hour) {
		if want := []int{1, 1, 60}[i]; w.Minutes != want {
			t.Errorf("window %d taken as %d minutes, want %d", i, w.Minutes, want)
		}
	}
}

// TestTrafficQuantile checks the estimate against histogram_quantile's worked
// out by hand.
func TestTrafficQuantile(t *testing.T) {
	var s trafficSum
	s.hist[0] = 10 // (0, 0.001]
	s.hist[4] = 10 // (0.01, 0.025]
	s.hist[8] = 20 // (0.25, 0.5]
	for _, c := range []struct{ q, want float64 }{
		{0.25, 0.001},                    // rank 10: the top of the first bucket
		{0.5, 0.01 + 0.015*10/10},        // rank 20: the top of (0.01, 0.025]
		{0.125, 0.0005},                  // rank 5: half way into (0, 0.001]
		{0.95, 0.25 + 0.25*(38-20)/20.0}, // rank 38: 18 of 20 into (0.25, 0.5]
	} {
		if got := s.quantile(c.q, 40); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q=%v: %v, want %v", c.q, got, c.want)
		}
	}
	var slow trafficSum
	slow.hist[len(durationBounds)] = 3 // all past 60 s
	if got := slow.quantile(0.5, 3); got != 60 {
		t.Errorf("past the largest bound: %v, want 60", got)
	}
	if got := (&trafficSum{}).quantile(0.5, 0); got != 0 {
		t.Errorf("no requests: %v, want 0", got)
	}
	for v, want := range map[float64]int{0: 0, 0.001: 0, 0.0011: 1, 0.12: 7, 60: 14, 61: 15} {
		if got := durationBucket(v); got != want {
			t.Errorf("durationBucket(%v) = %d, want %d", v, got, want)
		}
	}
}

// TestTrafficHandler checks the stats endpoint's answer and its refusals.
func TestTrafficHandler(t *testing.T) {
	f := newTrafficFixture(t, false)
	f.get(t, "web.localhost", "/fail", 3, 500)
	h := f.proxy.TrafficHandler()
	do := func(method, target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
		return rec
	}

	rec := do("GET", "/v1/apps/web/traffic?window=1m&window=1h&window=5m")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("200 expected: %d %s %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var raw []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) != 3 {
		t.Fatalf("%d windows, want 3: %s", len(raw), rec.Body)
	}
	for i, w := range raw {
		for _, k := range []string{"minutes", "requests", "status_4xx", "status_5xx", "p50_s", "p95_s"} {
			if _, ok := w[k]; !ok {
				t.Errorf("window %d has no %s: %s", i, k, rec.Body)
			}
		}
		if w["minutes"] != float64([]int{1, 60, 5}[i]) || w["requests"] != 3.0 || w["status_5xx"] != 3.0 {
			t.Errorf("window %d: %v, want 3 requests, 3 5xx", i, w)
		}
	}
	var def []TrafficWindow
	if rec := do("GET", "/v1/apps/never-asked/traffic"); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &def) != nil ||
		len(def) != 2 || def[0] != (TrafficWindow{Minutes: 5}) || def[1] != (TrafficWindow{Minutes: 60}) {
		t.Errorf("no window asked, an app without requests: %d %s, want zero figures for 5 and 60 minutes", rec.Code, rec.Body)
	}

	for target, reason := range map[string]string{
		"/v1/apps/Web/traffic":                                                   "only a-z, 0-9 and -",
		"/v1/apps/a_b/traffic":                                                   "only a-z, 0-9 and -",
		"/v1/apps/%28bex%29/traffic":                                             "only a-z, 0-9 and -",
		"/v1/apps/" + strings.Repeat("a", 64) + "/traffic":                       "1 to 63 characters",
		"/v1/apps/web/traffic?window=90s":                                        "whole minutes",
		"/v1/apps/web/traffic?window=0m":                                         "whole minutes",
		"/v1/apps/web/traffic?window=61m":                                        "whole minutes",
		"/v1/apps/web/traffic?window=2h":                                         "whole minutes",
		"/v1/apps/web/traffic?window=5":                                          "whole minutes",
		"/v1/apps/web/traffic?window=-5m":                                        "whole minutes",
		"/v1/apps/web/traffic?window=1m&window=2m&window=3m&window=4m&window=5m": "at most 4",
	} {
		rec := do("GET", target)
		body := rec.Body.String()
		if rec.Code != http.StatusBadRequest || !strings.Contains(body, reason) || strings.Count(body, "\n") != 1 {
			t.Errorf("GET %s: %d %q, want 400 saying %q in one line", target, rec.Code, body, reason)
		}
	}
	if rec := do("POST", "/v1/apps/web/traffic"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
	if rec := do("GET", "/v1/apps/web"); rec.Code != http.StatusNotFound {
		t.Errorf("GET /v1/apps/web: %d, want 404", rec.Code)
	}
}

// BenchmarkTrafficRecord is the ring's cost on a request's path, from every
// core at once on one app (the contended case).
func BenchmarkTrafficRecord(b *testing.B) {
	a := newAppTraffic("web")
	minute := time.Now().Unix() / 60
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			a.record(minute, 200+i%4*100, time.Duration(i%64)*time.Millisecond)
		}
	})
}

// BenchmarkTrafficObserve is what the proxy does once a request is answered
// (its metrics and, here discarded, its access log), the ring included.
func BenchmarkTrafficObserve(b *testing.B) {
	p, err := NewProxy(Config{}, staticTable("localhost", nil, nil), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		st := &reqState{route: Route{App: "web"}, id: "0123456789abcdef"}
		for pb.Next() {
			p.observe(st, "GET", "web.localhost", "/", 200, start, 0, 2)
		}
	})
}
