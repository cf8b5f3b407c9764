package webhook

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// deliverOver posts a signed GitHub push for app over real HTTP (loopback, kept-alive
// connections) and returns the status and how long the answer took.
func deliverOver(c *http.Client, url, app, delivery string) (int, time.Duration) {
	body := push("refs/heads/main", commit(1))
	req, _ := http.NewRequest(http.MethodPost, url+"/hooks/"+app, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set(HeaderGitHubSignature, Sign(secret, []byte(body)))
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, time.Since(start)
}

// BenchmarkAcknowledge measures the answer to a delivery while the app's build runs
// (the deliveries coalesce), over HTTP on loopback, beside the same HTTP stack
// answering 202 after reading the body (the baseline). Reported: p50 and p99 of
// 1000 deliveries per iteration. The bound is one second.
func BenchmarkAcknowledge(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Rate = rate.Inf
	d := &fakeRedeployer{block: make(chan struct{})}
	h, err := New(cfg, &fakeApps{secrets: [][]byte{secret}}, d, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { close(d.block); h.Close(context.Background()) }()
	srv := httptest.NewServer(h)
	defer srv.Close()
	base := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer base.Close()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	if code, _ := deliverOver(c, srv.URL, "shop", "start"); code != http.StatusAccepted {
		b.Fatalf("first delivery: %d", code)
	}
	const n = 1000
	var hook, bare []time.Duration
	i := 0
	for b.Loop() {
		for range n {
			i++
			code, took := deliverOver(c, srv.URL, "shop", fmt.Sprint(i))
			if code != http.StatusAccepted {
				b.Fatalf("delivery %d during the build: %d", i, code)
			}
			hook = append(hook, took)
			_, took = deliverOver(c, base.URL, "shop", fmt.Sprint(i))
			bare = append(bare, took)
		}
	}
	if calls := d.calls(); len(calls) != 1 {
		b.Fatalf("%d builds started during the build", len(calls))
	}
	slices.Sort(hook)
	slices.Sort(bare)
	pct := func(s []time.Duration, p float64) float64 { return s[int(float64(len(s)-1)*p)].Seconds() * 1e6 }
	b.ReportMetric(pct(hook, 0.5), "p50-µs")
	b.ReportMetric(pct(hook, 0.99), "p99-µs")
	b.ReportMetric(pct(bare, 0.5), "bare-p50-µs")
	b.ReportMetric(pct(bare, 0.99), "bare-p99-µs")
	b.ReportMetric(pct(hook, 0.99)/pct(bare, 0.99), "p99/bare")
}

// BenchmarkAcceptRate measures deliveries per second: accepted by one app with the
// default rate limit (1/s, burst 10) while 4 senders post as fast as they can for
// one second, and what the handler takes with no limit (2000 deliveries to the app
// while its build runs: lookup, verification, parsing, dedup and coalescing, on 4
// connections).
func BenchmarkAcceptRate(b *testing.B) {
	d := &fakeRedeployer{block: make(chan struct{})}
	h, err := New(DefaultConfig(), &fakeApps{secrets: [][]byte{secret}}, d, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { close(d.block); h.Close(context.Background()) }()
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}

	var limited, sent, unlimited float64
	round := 0
	for b.Loop() {
		round++
		h.mu.Lock()
		h.limiters = map[string]*rate.Limiter{}
		h.mu.Unlock()
		var accepted, total atomic.Int64
		deadline := time.Now().Add(time.Second)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					code, _ := deliverOver(c, srv.URL, "shop", fmt.Sprintf("r%d-w%d-%d", round, w, i))
					total.Add(1)
					if code == http.StatusAccepted {
						accepted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		limited += float64(accepted.Load())
		sent += float64(total.Load())

		// Capacity: no limit in the way.
		h.mu.Lock()
		h.cfg.Rate = rate.Inf
		h.limiters = map[string]*rate.Limiter{}
		h.mu.Unlock()
		start := time.Now()
		var next atomic.Int64
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > 2000 {
						return
					}
					if code, _ := deliverOver(c, srv.URL, "shop", fmt.Sprintf("cap%d-%d", round, i)); code != http.StatusAccepted {
						b.Errorf("delivery without a limit: %d", code)
						return
					}
				}
			}()
		}
		wg.Wait()
		unlimited += 2000 / time.Since(start).Seconds()
		h.mu.Lock()
		h.cfg.Rate = DefaultConfig().Rate
		h.mu.Unlock()
	}
	n := float64(b.N)
	b.ReportMetric(limited/n, "accepted/s-limited")
	b.ReportMetric(sent/n, "sent/s")
	b.ReportMetric(unlimited/n, "accepted/s-unlimited")
}
