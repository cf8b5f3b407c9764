package sourcelimit_test

import (
	"fmt"
	"testing"
	"time"

	"bex.co/bex/internal/sourcelimit"
)

// TestFailuresPerSource: a burst of failures, then refusals saying when to come
// back, a refill at the rate, successes for free, sources apart, and the map
// bounded.
func TestFailuresPerSource(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, err := sourcelimit.New(sourcelimit.Config{PerMinute: 10, Burst: 3, MaxSources: 4})
	if err != nil {
		t.Fatal(err)
	}
	l.Now = func() time.Time { return now }
	for range 10 {
		a, _ := l.Begin("1.2.3.4")
		if a == nil {
			t.Fatal("a success-only source is refused")
		}
		a.Succeeded()
	}
	for i := range 3 {
		a, _ := l.Begin("1.2.3.4")
		if a == nil {
			t.Fatalf("failure %d of the burst refused", i)
		}
		a.Failed()
		a.Succeeded() // too late: Failed counted first
	}
	a, wait := l.Begin("1.2.3.4")
	if a != nil || wait <= 0 || wait > 6*time.Second || sourcelimit.RetryAfter(wait) != 6 {
		t.Fatalf("past the burst: %v %v", a, wait)
	}
	if b, _ := l.Begin("5.6.7.8"); b == nil {
		t.Fatal("another source is refused")
	}
	now = now.Add(6 * time.Second) // one failure's worth at 10 a minute
	if a, _ = l.Begin("1.2.3.4"); a == nil {
		t.Fatal("no refill after 6s")
	}
	a.Failed()
	if a, _ = l.Begin("1.2.3.4"); a != nil {
		t.Fatal("the refill gave more than one")
	}
	// Bounded: new sources past MaxSources push out the full buckets first.
	for i := range 10 {
		if b, _ := l.Begin(fmt.Sprintf("10.0.0.%d", i)); b == nil {
			t.Fatalf("new source %d refused", i)
		}
	}
	if n := l.Len(); n > 4 {
		t.Fatalf("%d sources remembered, bound 4", n)
	}
}

func TestSource(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3.4:5678":                "1.2.3.4",
		"[::ffff:1.2.3.4]:1":          "1.2.3.4",
		"[2001:db8:1:2:3:4:5:6]:443":  "2001:db8:1:2::/64",
		"[2001:db8:1:2:ff::1%eth0]:1": "2001:db8:1:2::/64",
		"@":                           "@",
	} {
		if got := sourcelimit.Source(in); got != want {
			t.Errorf("Source(%q) = %q, want %q", in, got, want)
		}
	}
	if err := (sourcelimit.Config{}).Validate("c"); err == nil || fmt.Sprint(err) == "" {
		t.Error("a zero Config is valid")
	}
}
