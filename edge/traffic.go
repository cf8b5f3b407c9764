package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TrafficMinutes is how far back the edge keeps its own request figures: an hour,
// in one-minute buckets.
const TrafficMinutes = 60

// MaxTrafficWindows bounds the windows one stats request may ask for.
const MaxTrafficWindows = 4

// TrafficWindow is what the edge answered for one app over its last Minutes
// minutes, the current (partial) minute included. Status4xx counts 499 too (the
// client went away; nothing was sent); Status5xx the app's own 5xx and the
// edge's 502/503/504 alike.
type TrafficWindow struct {
	Minutes   int   `json:"minutes"`
	Requests  int64 `json:"requests"`
	Status4xx int64 `json:"status_4xx"`
	Status5xx int64 `json:"status_5xx"`
	// P50 and P95 are latency quantiles in seconds (request to the end of the
	// response), estimated from the buckets of request_duration_seconds as
	// Prometheus' histogram_quantile does: linear inside the bucket the rank
	// falls in. 0 without requests.
	P50 float64 `json:"p50_s"`
	P95 float64 `json:"p95_s"`
}

// trafficBucket is one app's counts for one minute. Requests are the sum of the
// histogram: one counter fewer on every request's path.
type trafficBucket struct {
	minute     atomic.Int64 // Unix minute counted; 0 (1970) never is
	s4xx, s5xx atomic.Uint64
	hist       [len(durationBounds) + 1]atomic.Uint64 // the last: past the largest bound
}

// appTraffic is one app's ring of the last TrafficMinutes minutes. Requests add
// to the bucket of their minute with atomics alone; mu is only taken to turn a
// bucket over to a new minute, once a minute per app.
type appTraffic struct {
	mu   sync.Mutex
	ring [TrafficMinutes]trafficBucket
}

// newAppTraffic is the ring of app, or nil for the requests no app answered
// (unknown hosts): nobody asks for their figures.
func newAppTraffic(app string) *appTraffic {
	if app == "" {
		return nil
	}
	return &appTraffic{}
}

// trafficMinute is the Unix minute a request that ended at end is counted in:
// the clock of tests when they set one, else end itself (no second clock read on
// the request's path).
func (m *metrics) trafficMinute(end time.Time) int64 {
	if m.trafficClock != nil {
		end = m.trafficClock()
	}
	return end.Unix() / 60
}

// trafficNow is the current Unix minute, for reading the figures.
func (m *metrics) trafficNow() int64 { return m.trafficMinute(time.Now()) }

// record counts one answered request of minute.
func (a *appTraffic) record(minute int64, status int, d time.Duration) {
	if a == nil {
		return
	}
	b := &a.ring[minute%TrafficMinutes]
	if cur := b.minute.Load(); cur != minute && !a.turn(b, minute) {
		return
	}
	b.hist[durationBucket(d.Seconds())].Add(1)
	switch {
	case status >= 500 && status < 600:
		b.s5xx.Add(1)
	case status >= 400 && status < 500:
		b.s4xx.Add(1)
	}
}

// turn empties b for minute, unless another request did already. It reports
// false when b holds a later minute: the request ended an hour or more before
// that one (or the clock went back) and is dropped rather than erase newer
// counts.
func (a *appTraffic) turn(b *trafficBucket, minute int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch cur := b.minute.Load(); {
	case cur == minute:
		return true
	case cur > minute:
		return false
	}
	// Zeroed before the minute is published: a request that sees the new minute
	// adds to empty counters. One that read the old minute before the lock and
	// adds after it is an hour late, and rare enough to be miscounted.
	b.s4xx.Store(0)
	b.s5xx.Store(0)
	for i := range b.hist {
		b.hist[i].Store(0)
	}
	b.minute.Store(minute)
	return true
}

// trafficSum is the counts of several buckets added up.
type trafficSum struct {
	s4xx, s5xx uint64
	hist       [len(durationBounds) + 1]uint64
}

// sum adds up the buckets of the minutes in (now-minutes, now].
func (a *appTraffic) sum(now int64, minutes int) trafficSum {
	var s trafficSum
	if a == nil {
		return s
	}
	for i := range a.ring {
		b := &a.ring[i]
		m := b.minute.Load()
		if m <= now-int64(minutes) || m > now {
			continue
		}
		var one trafficSum
		one.s4xx, one.s5xx = b.s4xx.Load(), b.s5xx.Load()
		for j := range b.hist {
			one.hist[j] = b.hist[j].Load()
		}
		if b.minute.Load() != m {
			continue // turned over while read: the old minute is gone, the new one empty
		}
		s.s4xx += one.s4xx
		s.s5xx += one.s5xx
		for j := range s.hist {
			s.hist[j] += one.hist[j]
		}
	}
	return s
}

func (s *trafficSum) window(minutes int) TrafficWindow {
	var n uint64
	for _, c := range s.hist {
		n += c
	}
	w := TrafficWindow{Minutes: minutes, Requests: int64(n), Status4xx: int64(s.s4xx), Status5xx: int64(s.s5xx)}
	w.P50, w.P95 = s.quantile(0.5, n), s.quantile(0.95, n)
	return w
}

// quantile estimates the q-quantile from the histogram of n requests as
// Prometheus' histogram_quantile does: the bucket the rank falls in, linearly
// inside it (from 0 for the first bucket); a rank past the largest bound is that
// bound.
func (s *trafficSum) quantile(q float64, n uint64) float64 {
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var below uint64
	for i, bound := range durationBounds {
		c := s.hist[i]
		if float64(below+c) >= rank && c > 0 {
			lower := 0.0
			if i > 0 {
				lower = durationBounds[i-1]
			}
			return lower + (bound-lower)*(rank-float64(below))/float64(c)
		}
		below += c
	}
	return durationBounds[len(durationBounds)-1]
}

// durationBucket is the index of the first bound v is within (Prometheus
// counts v in every bucket whose upper bound is >= v), or len(durationBounds)
// past them all.
func durationBucket(v float64) int {
	for i, bound := range durationBounds {
		if v <= bound {
			return i
		}
	}
	return len(durationBounds)
}

// AppTraffic returns the figures of app over each of windows, in the order
// given. A window counts in whole minutes (rounded down), at least 1 and at most
// TrafficMinutes. An app the edge answered no request for has zero figures.
func (p *Proxy) AppTraffic(app string, windows ...time.Duration) []TrafficWindow {
	var a *appTraffic
	if app != "" {
		if am, ok := p.m.apps.Load(app); ok {
			a = am.(*appMetrics).traffic
		}
	}
	now := p.m.trafficNow()
	out := make([]TrafficWindow, len(windows))
	for i, w := range windows {
		minutes := min(max(int(w/time.Minute), 1), TrafficMinutes)
		s := a.sum(now, minutes)
		out[i] = s.window(minutes)
	}
	return out
}

// TrafficHandler serves GET /v1/apps/{app}/traffic?window=5m&window=60m: the
// app's TrafficWindows as a JSON list, in the order asked (5m and 60m when none
// is). Windows are durations of whole minutes, 1m to 60m, at most
// MaxTrafficWindows; anything else is a 400 with a one-line reason. It names
// every app's traffic to whoever reaches it: serve it where only the platform
// does (bex edge --stats-addr).
func (p *Proxy) TrafficHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/apps/{app}/traffic", func(w http.ResponseWriter, r *http.Request) {
		app := r.PathValue("app")
		if err := checkTrafficApp(app); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		windows, err := parseTrafficWindows(r.URL.Query()["window"])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeStats(w, p.AppTraffic(app, windows...))
	})
	return mux
}

// writeStats answers v as JSON, never cached: the stats routes' one way to
// answer.
func writeStats(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(body, '\n'))
}

// checkTrafficApp accepts what can be an app's name: a DNS label of lower-case
// letters, digits and dashes.
func checkTrafficApp(app string) error {
	if app == "" || len(app) > 63 {
		return fmt.Errorf("app name %q: give 1 to 63 characters", truncate(app, 70))
	}
	if strings.IndexFunc(app, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}) >= 0 {
		return fmt.Errorf("app name %q: only a-z, 0-9 and - are allowed", app)
	}
	return nil
}

// parseTrafficWindows reads the window parameters; none asks for 5m and 60m.
func parseTrafficWindows(vals []string) ([]time.Duration, error) {
	if len(vals) == 0 {
		return []time.Duration{5 * time.Minute, 60 * time.Minute}, nil
	}
	if len(vals) > MaxTrafficWindows {
		return nil, fmt.Errorf("%d windows: ask for at most %d", len(vals), MaxTrafficWindows)
	}
	out := make([]time.Duration, len(vals))
	for i, v := range vals {
		d, err := time.ParseDuration(v)
		if err != nil || d%time.Minute != 0 || d < time.Minute || d > TrafficMinutes*time.Minute {
			return nil, fmt.Errorf("window %q: give whole minutes from 1m to %dm, such as 5m", truncate(v, 20), TrafficMinutes)
		}
		out[i] = d
	}
	return out, nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
