package backend

import (
	"context"
	"fmt"
	"time"
)

// Traffic reads the edge's own counters of the requests it answered for an
// app: the figures of metrics and diagnose. cmd/bex wires it to the edge's
// stats endpoint; the Prometheus series stay the edge's for those who keep
// histograms.
type Traffic interface {
	// AppTraffic returns app's figures over each of windows (each a whole
	// number of minutes, at most an hour), in the order asked. An app the edge
	// has answered no request for has zero figures, not an error.
	AppTraffic(ctx context.Context, app string, windows ...time.Duration) ([]TrafficWindow, error)
}

// TrafficWindow is what the edge answered for one app over the last Window.
type TrafficWindow struct {
	Window time.Duration `json:"-"`
	// Minutes is Window in minutes, for JSON.
	Minutes int `json:"minutes"`
	// Requests counts the responses; Status5xx those with a 5xx status
	// (the app's own and the edge's 502/503/504 alike).
	Requests  int64 `json:"requests"`
	Status5xx int64 `json:"status_5xx"`
	Status4xx int64 `json:"status_4xx"`
	// P50 and P95 are the latency quantiles in seconds (request to the end of
	// the response), estimated from a histogram: 0 without requests.
	P50 float64 `json:"p50_s"`
	P95 float64 `json:"p95_s"`
}

// AppMetrics are an app's request figures over the last 5 and 60 minutes,
// from the edge's own counters.
type AppMetrics struct {
	App     string          `json:"app"`
	Windows []TrafficWindow `json:"windows"`
}

// MetricsWindows are the windows metrics and diagnose show.
var MetricsWindows = []time.Duration{5 * time.Minute, time.Hour}

// Metrics are the request figures of an app u may use over MetricsWindows.
func (b *Backend) Metrics(ctx context.Context, u *User, name string) (*AppMetrics, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if b.cfg.Traffic == nil {
		return nil, Errorf(Invalid, "this server has no figures of its edge (metrics need bex up's edge; on a cluster, its Prometheus series)")
	}
	ws, err := b.cfg.Traffic.AppTraffic(ctx, a.Name, MetricsWindows...)
	if err != nil {
		return nil, fmt.Errorf("reading the edge's figures of %s: %w", a.Name, err)
	}
	for i := range ws {
		ws[i].Minutes = int(ws[i].Window / time.Minute)
	}
	return &AppMetrics{App: a.Name, Windows: ws}, nil
}

// AppCertificates is the certificate state of the hosts of an app u may use,
// as the edge knows it.
func (b *Backend) AppCertificates(ctx context.Context, u *User, name string) ([]CertificateState, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if b.cfg.Certificates == nil {
		return nil, Errorf(Invalid, "this server does not read its edge's certificates (bex up's edge does; on a cluster, the edge's own logs and metrics)")
	}
	certs, err := b.cfg.Certificates.AppCertificates(ctx, a.Name)
	if err != nil {
		return nil, fmt.Errorf("reading the edge's certificates of %s: %w", a.Name, err)
	}
	if certs == nil {
		certs = []CertificateState{}
	}
	return certs, nil
}
