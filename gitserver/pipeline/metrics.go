package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pipeline's share of the gitserver's metrics (bex_git_...).
type metrics struct {
	build   prometheus.Histogram
	rollout prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		build: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "bex", Subsystem: "git", Name: "build_seconds",
			Help: "Time a push spent building.", Buckets: prometheus.ExponentialBuckets(0.1, 2, 14),
		}),
		rollout: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "bex", Subsystem: "git", Name: "rollout_seconds",
			Help: "Time a push waited for its release to serve.", Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.build, m.rollout)
	}
	return m
}
