package edge

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"bex.co/bex/internal/clientaddr"
)

// HeaderRequestID carries a request's id from the client (if it sent a usable one)
// or the edge, to the backend and back in the response, so that one id ties the
// access log, the app's own log and what the user saw.
const HeaderRequestID = "X-Request-Id"

// StatusClientClosedRequest is the status logged (never sent) when the client went
// away before the response: nginx's 499, so that dashboards tell it from a 5xx.
const StatusClientClosedRequest = 499

// BackendError is the error the proxy's transport returns for a failed round trip:
// the status the client gets, decided where the cause is known (the transport) and
// carried to the ReverseProxy's ErrorHandler, which only renders it.
type BackendError struct {
	Status  int    // 502, 504, or StatusClientClosedRequest
	Backend string // host:port of the last backend tried
	Err     error
}

func (e *BackendError) Error() string {
	return fmt.Sprintf("backend %s: %d: %v", e.Backend, e.Status, e.Err)
}

func (e *BackendError) Unwrap() error { return e.Err }

// Proxy is the edge's http.Handler: it routes each request by its Host through the
// Table and reverse-proxies it to one of the app's backends, round-robin.
type Proxy struct {
	table *Table
	log   *slog.Logger
	m     *metrics
	rp    *httputil.ReverseProxy
	cfg   Config
}

// NewProxy returns the proxy for table. Metrics are registered on reg unless it is
// nil; the access log goes to log (slog.Default() if nil).
func NewProxy(cfg Config, table *Table, log *slog.Logger, reg prometheus.Registerer) (*Proxy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{table: table, log: log, m: newMetrics(reg), cfg: cfg}
	base := &http.Transport{
		Proxy: nil, // never an HTTP_PROXY from the environment: backends are local
		DialContext: (&net.Dialer{
			Timeout:   cfg.DialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ResponseHeaderTimeout:  cfg.ResponseHeaderTimeout,
		IdleConnTimeout:        cfg.IdleConnTimeout,
		MaxIdleConns:           cfg.MaxIdleConns,
		MaxIdleConnsPerHost:    cfg.MaxIdleConnsPerHost,
		MaxResponseHeaderBytes: int64(cfg.MaxHeaderBytes),
		ExpectContinueTimeout:  time.Second,
		// Pass bodies through as the backend encoded them; decompressing and
		// recompressing would cost CPU and break streaming.
		DisableCompression: true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: &transport{rt: newBackendTransport(cfg, base)},
		// 0 lets ReverseProxy decide per response: server-sent events and bodies of
		// unknown length (streams) are flushed after every write; a body of known
		// length goes out with its headers in one write instead of two.
		FlushInterval:  0,
		BufferPool:     copyBuffers,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		// ReverseProxy logs copy errors (mostly clients going away) on its own; the
		// access log already has the outcome.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p, nil
}

// ConfigureServer sets the client-facing limits of s from the Config and hooks its
// connection states into the active-connections gauge. Call it before s serves.
func (p *Proxy) ConfigureServer(s *http.Server) {
	s.MaxHeaderBytes = p.cfg.MaxHeaderBytes
	s.ReadHeaderTimeout = p.cfg.ReadHeaderTimeout
	s.IdleTimeout = p.cfg.ClientIdleTimeout
	prev := s.ConnState
	s.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			p.m.connections.Inc()
		case http.StateClosed, http.StateHijacked:
			p.m.connections.Dec()
		}
		if prev != nil {
			prev(c, st)
		}
	}
}

// reqState travels in the request's context from ServeHTTP through Rewrite and the
// transport to ModifyResponse/ErrorHandler, and back to the access log.
type reqState struct {
	route    Route
	id       string
	pick     uint64
	backend  atomic.Pointer[string] // last backend tried (the transport may retry)
	upstream int                    // the backend's status (for 101, never written to rec)
	status   int                    // overrides the recorded status (499)
}

type stateKey struct{}

// tlsStateKey carries the *tls.ConnectionState of a TLS connection that the fast
// lane handed to net/http (see Server), in the request's context.
type tlsStateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st := &reqState{id: requestID(r.Header.Get(HeaderRequestID))}
	rec := &recorder{ResponseWriter: w, wantsHTML: strings.Contains(r.Header.Get("Accept"), "text/html")}
	var body *countingBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingBody{ReadCloser: r.Body}
		r.Body = body
	}
	host := hostOnly(r.Host)
	p.m.inFlight.Inc()
	defer func() {
		p.m.inFlight.Dec()
		status := rec.status
		if st.status != 0 {
			status = st.status
		} else if status == 0 {
			status = st.upstream
		}
		var in int64
		if body != nil {
			in = body.n.Load()
		}
		p.observe(st, r.Method, host, r.URL.Path, status, start, in, rec.bytes)
	}()
	if r.TLS == nil {
		// A connection that the fast lane handed over is not a *tls.Conn to net/http.
		if cs, ok := r.Context().Value(tlsStateKey{}).(*tls.ConnectionState); ok {
			r.TLS = cs
		}
	}

	if !p.table.Ready() {
		p.page(rec, st, http.StatusServiceUnavailable, "The edge is starting", "The edge is starting; try again in a moment.")
		return
	}
	route, ok := p.table.Lookup(host)
	if !ok {
		p.page(rec, st, http.StatusNotFound, "No such app", "No app answers at "+host+".")
		return
	}
	st.route = route
	if route.Platform && !IsPlatformPath(r.URL.Path) {
		p.page(rec, st, http.StatusNotFound, "Not found", "Nothing is served at "+host+r.URL.Path+": apps answer at <app>."+host+".")
		return
	}
	if route.Suspended {
		p.page(rec, st, http.StatusServiceUnavailable, "App suspended", route.App+" is suspended.")
		return
	}
	if len(route.Backends) == 0 {
		p.page(rec, st, http.StatusServiceUnavailable, "App not running", route.App+" has no running instance right now.")
		return
	}
	st.pick = route.next.Add(1) - 1
	p.rp.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
}

// observe counts a finished request in its app's metrics and writes its access log
// line.
func (p *Proxy) observe(st *reqState, method, host, path string, status int, start time.Time, in, out int64) {
	d := time.Since(start)
	am := p.m.app(st.route.App)
	am.requests(status).Inc()
	am.duration.Observe(d.Seconds())
	am.traffic.record(p.m.trafficMinute(start.Add(d)), status, d)
	am.bytesOut.Add(float64(out))
	am.bytesIn.Add(float64(in))
	backend := ""
	if b := st.backend.Load(); b != nil {
		backend = *b
	}
	// LogAttrs: no []any to allocate, no values to box, once per request.
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "request", slog.String("method", method),
		slog.String("host", host), slog.String("path", path), slog.Int("status", status),
		slog.Duration("duration", d), slog.String("app", st.route.App), slog.String("backend", backend),
		slog.String("request_id", st.id), slog.Int64("bytes_in", in), slog.Int64("bytes_out", out))
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	b := st.route.Backends[st.pick%uint64(len(st.route.Backends))]
	st.backend.Store(&b)
	pr.SetURL(&url.URL{Scheme: "http", Host: b})
	// Apps see the host the client asked for (their own domain), as on Heroku;
	// SetURL would have put the backend's address there.
	pr.Out.Host = pr.In.Host
	// X-Forwarded-Host and -Proto from what the edge saw (ReverseProxy dropped
	// the client's); the client's address from clientIP, and no other header a
	// client could name an address in: the lane does the same (serveLane).
	pr.SetXForwarded()
	peer, _, _ := net.SplitHostPort(pr.In.RemoteAddr)
	setClientAddr(pr.Out.Header, clientaddr.Trusted(p.cfg.TrustedProxies).Client(peer, pr.In.Header["X-Forwarded-For"]))
	if st.route.Platform && len(p.cfg.PlatformSecret) > 0 {
		// The gitserver's limits on failed tokens and signatures believe the
		// address above because of this; an app's backend never sees it.
		pr.Out.Header[clientaddr.HeaderProxySecret] = []string{string(p.cfg.PlatformSecret)}
	}
	pr.Out.Header.Set(HeaderRequestID, st.id)
}

func (p *Proxy) modifyResponse(res *http.Response) error {
	st := stateOf(res.Request.Context())
	st.upstream = res.StatusCode
	// Set, not add: the edge's id is the one in its log, whatever the app echoes.
	// Set here rather than on the ResponseWriter up front, because ReverseProxy
	// clears the writer's headers after relaying a 1xx response.
	res.Header.Set(HeaderRequestID, st.id)
	return nil
}

func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	rec, _ := w.(*recorder)
	status, body, ok := p.errorPage(w.Header(), st, rec != nil && rec.wantsHTML, err, r.Context().Err() != nil)
	if !ok {
		return
	}
	w.WriteHeader(status)
	w.Write(body)
}

// page writes the edge's own small answer: HTML for browsers, text otherwise.
func (p *Proxy) page(w http.ResponseWriter, st *reqState, status int, title, msg string) {
	rec, ok := w.(*recorder)
	body := renderPage(w.Header(), st.id, status, ok && rec.wantsHTML, title, msg)
	w.WriteHeader(status)
	w.Write(body)
}

// renderPage sets the headers of one of the edge's own pages on h and returns its
// body.
func renderPage(h http.Header, id string, status int, wantsHTML bool, title, msg string) []byte {
	h.Set(HeaderRequestID, id)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "5")
	}
	if wantsHTML {
		h.Set("Content-Type", "text/html; charset=utf-8")
		return fmt.Appendf(nil, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>%d %s</title></head>"+
			"<body><h1>%s</h1><p>%s</p><p><small>request %s</small></p></body></html>\n",
			status, html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg), html.EscapeString(id))
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	return fmt.Appendf(nil, "%s\nrequest %s\n", msg, id)
}

// errorPage renders the page for a failed round trip, or reports false when the
// client went away and nobody is left to answer.
func (p *Proxy) errorPage(h http.Header, st *reqState, wantsHTML bool, err error, clientGone bool) (int, []byte, bool) {
	status := http.StatusBadGateway
	var be *BackendError
	if errors.As(err, &be) {
		status = be.Status
	}
	if clientGone {
		status = StatusClientClosedRequest
	}
	if status == StatusClientClosedRequest {
		st.status = status // nobody to answer; only the log and metrics see it
		p.log.Debug("client went away", "request_id", st.id, "err", err)
		return status, nil, false
	}
	p.log.Warn("backend failed", "app", st.route.App, "request_id", st.id, "status", status, "err", err)
	if status == http.StatusGatewayTimeout {
		return status, renderPage(h, st.id, status, wantsHTML, "App timed out", st.route.App+" did not answer in time."), true
	}
	return http.StatusBadGateway, renderPage(h, st.id, http.StatusBadGateway, wantsHTML,
		"App not answering", st.route.App+" could not be reached."), true
}

// transport chooses nothing but the retry: Rewrite picked the backend, and a
// refused connection is tried once more on the next backend of the same snapshot.
type transport struct{ rt http.RoundTripper }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	res, err := t.rt.RoundTrip(req)
	if err != nil && st != nil && len(st.route.Backends) > 1 && retriable(req) &&
		errors.Is(err, syscall.ECONNREFUSED) && req.Context().Err() == nil {
		next := st.route.Backends[(st.pick+1)%uint64(len(st.route.Backends))]
		st.backend.Store(&next)
		retry := req.Clone(req.Context())
		retry.URL.Host = next
		res, err = t.rt.RoundTrip(retry)
	}
	if err != nil {
		backend := req.URL.Host
		if st != nil {
			if b := st.backend.Load(); b != nil {
				backend = *b
			}
		}
		return nil, &BackendError{Status: classify(req.Context(), err), Backend: backend, Err: err}
	}
	return res, nil
}

// retriable: an idempotent method and no body. A refused dial sent nothing, but
// the transport closes the body on any error, so a request with a body cannot be
// replayed (incoming requests have no GetBody).
func retriable(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete:
	default:
		return false
	}
	return req.Body == nil || req.Body == http.NoBody
}

func classify(ctx context.Context, err error) int {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return StatusClientClosedRequest
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return http.StatusBadGateway // refused, unreachable, or a dial timeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// requestID keeps a client's id if it is short and plain, else makes a new one: the
// id goes into logs and headers, so it must not carry arbitrary bytes. A made-up id
// needs to be unique, not secret: math/rand's per-thread generator makes one without
// the system call that crypto/rand costs.
func requestID(in string) string {
	if in != "" && len(in) <= 128 && strings.IndexFunc(in, func(r rune) bool {
		return r <= ' ' || r > '~'
	}) < 0 {
		return in
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], mrand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], mrand.Uint64())
	return hex.EncodeToString(b[:])
}

// copyBuffers are ReverseProxy's body copy buffers: without a pool each response
// allocates (and zeroes) 32 KiB.
var copyBuffers = &bufferPool{}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// hostOnly strips the port from a Host header value.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

// recorder notes the status and body size for the log. It hides nothing: Flush and
// Hijack reach the real writer through Unwrap (http.ResponseController), which
// ReverseProxy uses for streaming and upgrades.
type recorder struct {
	http.ResponseWriter
	status    int
	bytes     int64
	wantsHTML bool
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (c *countingBody) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	c.n.Add(int64(n))
	return n, err
}
