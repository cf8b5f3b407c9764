package gitserver

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	pushes  *prometheus.CounterVec
	receive prometheus.Histogram
	// refused counts what the SSH limits turned away, by limit.
	refused *prometheus.CounterVec
	// unauthWaits is how long connections past the unauthenticated caps
	// waited for a slot.
	unauthWaits prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "bex", Subsystem: "git", Name: "pushes_total",
			Help: "Pushes by result: deployed, stored (no deploy), rejected, failed (build or rollout), cancelled.",
		}, []string{"result"}),
		receive: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "bex", Subsystem: "git", Name: "receive_seconds",
			Help: "Time to receive and store a push's pack.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "bex", Subsystem: "git", Name: "ssh_refused_total",
			Help: "SSH connections, sessions and env requests refused by a limit: unauthenticated (the per-source or total cap, with its queue full or the wait over), sessions (per connection), env.",
		}, []string{"limit"}),
		unauthWaits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "bex", Subsystem: "git", Name: "ssh_unauthenticated_wait_seconds",
			Help:    "Time an SSH connection past the unauthenticated caps waited for a slot (a burst from one address), whether it got one or not.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.pushes, m.receive, m.refused, m.unauthWaits)
	}
	return m
}
