package edge

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the edge's Prometheus series. The app label is the app's name, or
// "" for requests no app answered (unknown hosts).
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	bytesOut    *prometheus.CounterVec
	bytesIn     *prometheus.CounterVec
	connections prometheus.Gauge
	inFlight    prometheus.Gauge
	handoffs    prometheus.Counter

	apps sync.Map // app name -> *appMetrics
	// trafficClock, when set (tests), dates the requests counted in the apps'
	// traffic rings and reads them.
	trafficClock func() time.Time
}

// durationBounds are the buckets of request_duration_seconds, and of the apps'
// traffic rings (traffic.go).
var durationBounds = [...]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// appMetrics are one app's series, looked up once: a label lookup hashes the label
// values and takes a lock, four times per request otherwise.
type appMetrics struct {
	m                 *metrics
	app               string
	duration          prometheus.Observer
	bytesOut, bytesIn prometheus.Counter
	codes             sync.Map    // int status -> prometheus.Counter
	traffic           *appTraffic // the last hour, for the edge's stats; nil for app ""
}

func (m *metrics) app(name string) *appMetrics {
	if am, ok := m.apps.Load(name); ok {
		return am.(*appMetrics)
	}
	am, _ := m.apps.LoadOrStore(name, &appMetrics{m: m, app: name,
		duration: m.duration.WithLabelValues(name),
		bytesOut: m.bytesOut.WithLabelValues(name),
		bytesIn:  m.bytesIn.WithLabelValues(name),
		traffic:  newAppTraffic(name)})
	return am.(*appMetrics)
}

func (am *appMetrics) requests(status int) prometheus.Counter {
	if c, ok := am.codes.Load(status); ok {
		return c.(prometheus.Counter)
	}
	c, _ := am.codes.LoadOrStore(status, am.m.requests.WithLabelValues(am.app, strconv.Itoa(status)))
	return c.(prometheus.Counter)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "bex", "edge"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_total", Help: "Requests answered, by app and HTTP status code."}, []string{"app", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "request_duration_seconds", Help: "Time from request to the end of the response, by app.",
			Buckets: durationBounds[:]},
			[]string{"app"}),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "response_bytes_total", Help: "Response body bytes sent to clients, by app."}, []string{"app"}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "request_bytes_total", Help: "Request body bytes read from clients, by app."}, []string{"app"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "connections_active", Help: "Open client connections (of a Server, or of an http.Server passed to Proxy.ConfigureServer)."}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_in_flight", Help: "Requests being proxied now."}),
		handoffs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "fast_lane_handoffs_total", Help: "Client connections the fast lane handed to net/http: HTTP/2, a request with a body, an upgrade, an error page, ..."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.bytesOut, m.bytesIn, m.connections, m.inFlight, m.handoffs)
	}
	return m
}

// certMetrics count certificate events from certmagic, by issuer (its storage key:
// the ACME directory's host and path, or the local CA) and outcome: obtained,
// renewed, obtain_failed, renew_failed.
// Refusals count the certificates not obtained on demand, by reason
// (RefusedNotRouted, ...).
type certMetrics struct {
	events   *prometheus.CounterVec
	refusals *prometheus.CounterVec
}

func newCertMetrics(reg prometheus.Registerer) *certMetrics {
	m := &certMetrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "bex", Subsystem: "edge",
		Name: "certificates_total", Help: "Certificates obtained or renewed, and failures to, by issuer and outcome."},
		[]string{"issuer", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "bex", Subsystem: "edge",
			Name: "certificate_refusals_total", Help: "Certificates refused during TLS handshakes, by reason: not_routed, public_suffix, domain_rate_limited, rate_limited."},
			[]string{"reason"})}
	for _, r := range []string{RefusedNotRouted, RefusedPublicSuffix, RefusedDomainLimited, RefusedLimited} {
		m.refusals.WithLabelValues(r) // every reason shows, at 0, before its first refusal
	}
	if reg != nil {
		reg.MustRegister(m.events, m.refusals)
	}
	return m
}

func (m *certMetrics) refused(reason string) { m.refusals.WithLabelValues(reason).Inc() }

// wants is certmagic's ShouldEmitFunc: without it every handshake would build an
// event for onEvent to ignore.
func (m *certMetrics) wants(event string) bool {
	return event == "cert_obtained" || event == "cert_failed" || event == "cert_obtaining"
}

// onEvent is certmagic's OnEvent hook.
func (m *certMetrics) onEvent(_ context.Context, event string, data map[string]any) error {
	renewal, _ := data["renewal"].(bool)
	switch event {
	case "cert_obtained":
		issuer, _ := data["issuer"].(string)
		outcome := "obtained"
		if renewal {
			outcome = "renewed"
		}
		m.events.WithLabelValues(issuer, outcome).Inc()
	case "cert_failed":
		// Every issuer was tried; with one issuer per edge, it is that one.
		issuers, _ := data["issuers"].([]string)
		outcome := "obtain_failed"
		if renewal {
			outcome = "renew_failed"
		}
		m.events.WithLabelValues(strings.Join(issuers, ","), outcome).Inc()
	}
	return nil
}
