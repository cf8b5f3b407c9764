package webhook

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/clientaddr"
	"bex.co/bex/internal/sourcelimit"
)

// Apps looks up webhooks (the backend's Hook). Implementations read a cache: it
// is asked on every delivery, before the signature is checked.
type Apps interface {
	// Hook returns app's webhook, or an error of kind NotFound when there is no
	// such app. A hook without secrets takes no delivery; the handler answers it
	// as it answers an unknown app.
	Hook(ctx context.Context, app string) (*backend.Hook, error)
}

// Redeployer runs the redeploys deliveries ask for (the backend's Redeploy;
// cmd/bex wires it).
type Redeployer interface {
	// Redeploy builds and rolls out r.App's deploy branch: the branch as fetched
	// from the app's upstream when it has one, else its current commit. It returns
	// when the release serves, or with the reason it does not (the previous
	// release keeps serving), or with ctx's error.
	Redeploy(ctx context.Context, r Redeploy) error
}

// Redeploy is one redeploy asked for by deliveries.
type Redeploy struct {
	App string
	// Delivery is the id of the newest delivery it answers (recorded in the
	// Release), and Provider who sent it.
	Delivery string
	Provider Provider
	// Commit is what the newest delivery said the branch is at; informational: the
	// Redeployer builds what the branch is at when the build starts.
	Commit string
	// Coalesced are the ids of older deliveries that this redeploy also answers.
	Coalesced []string
}

// Config bounds the handler. DefaultConfig gives the defaults.
type Config struct {
	// Prefix is the path under which hooks are served: <Prefix><app>.
	Prefix string
	// MaxBodyBytes bounds a delivery's body (GitHub caps its payloads at 25 MB, but
	// a push event is a few KiB; bigger is refused with 413).
	MaxBodyBytes int64
	// Rate and Burst are each app's token bucket for accepted deliveries; past it,
	// 429 with Retry-After.
	Rate  rate.Limit
	Burst int
	// MaxWaiting bounds the apps with a redeploy running or waiting; past it, 503.
	MaxWaiting int
	// Remember is how many delivery ids are kept to recognise a repeated delivery.
	Remember int
	// DeployTimeout bounds one redeploy, fetch to rollout.
	DeployTimeout time.Duration
	// LookupTimeout bounds the hook lookup of one request, so that an answer
	// comes within a second even when the API is slow.
	LookupTimeout time.Duration
	// BadSignatures is each source's bucket for deliveries with a missing or
	// wrong signature: past it such a delivery gets 429 with Retry-After instead
	// of 401, and is no longer logged one by one. A well-signed delivery is never
	// refused by it, so that a source shared with an attacker (a NAT, an
	// untrusted proxy) still delivers.
	BadSignatures sourcelimit.Config
	// TrustedProxies are the peers whose X-Forwarded-For is believed: a request
	// from one of them is counted under the last hop of that header (the address
	// the proxy saw), any other under its own address. bex's edge reaches the
	// gitserver from 127.0.0.1 under `bex up`, hence the default. On a
	// cluster the edge is known by ProxySecret instead.
	TrustedProxies clientaddr.Trusted
	// ProxySecret, when set, makes a trusted proxy of any peer that sends it in
	// clientaddr.HeaderProxySecret: bex's edge on a cluster, whose address no
	// list can tell from a tenant's pod's (clientaddr.OfProxiedRequest).
	ProxySecret []byte
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Prefix:        "/hooks/",
		MaxBodyBytes:  1 << 20,
		Rate:          rate.Limit(1),
		Burst:         10,
		MaxWaiting:    256,
		Remember:      4096,
		DeployTimeout: 25 * time.Minute,
		LookupTimeout: 800 * time.Millisecond,

		BadSignatures:  sourcelimit.Config{PerMinute: 10, Burst: 10, MaxSources: 4096},
		TrustedProxies: clientaddr.Trusted{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")},
	}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		errs = append(errs, fmt.Errorf("Config.Prefix %q: must start and end with /", c.Prefix))
	}
	for _, n := range []struct {
		name string
		ok   bool
	}{
		{"MaxBodyBytes", c.MaxBodyBytes > 0}, {"Rate", c.Rate > 0}, {"Burst", c.Burst >= 1},
		{"MaxWaiting", c.MaxWaiting >= 1}, {"Remember", c.Remember >= 1},
		{"DeployTimeout", c.DeployTimeout > 0}, {"LookupTimeout", c.LookupTimeout > 0},
	} {
		if !n.ok {
			errs = append(errs, fmt.Errorf("Config.%s: must be positive", n.name))
		}
	}
	if err := c.BadSignatures.Validate("Config.BadSignatures"); err != nil {
		errs = append(errs, err)
	}
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("Config.TrustedProxies[%d]: not a valid address prefix", i))
		}
	}
	if c.ProxySecret != nil {
		if err := clientaddr.CheckSecret(c.ProxySecret); err != nil {
			errs = append(errs, fmt.Errorf("Config.ProxySecret: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	return nil
}

// Handler serves the webhooks. It is an http.Handler for the paths under
// Config.Prefix.
type Handler struct {
	cfg      Config
	apps     Apps
	deployer Redeployer
	log      *slog.Logger

	mu       sync.Mutex
	queues   map[string]*queue // apps with a redeploy running
	limiters map[string]*rate.Limiter
	seen     *seenSet
	// bodies remembers the bodies with their signatures (a hash of both) of the
	// deliveries taken, as seen does their ids.
	bodies *seenSet
	// badSigs counts bad signatures by source; quiet are the sources refused
	// since their last allowed one, logged as such once.
	badSigs *sourcelimit.Limiter
	quiet   map[string]bool
	closed  bool

	ctx    context.Context // ends the redeploys on Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a handler. log receives the rejections and the redeploys' results.
func New(cfg Config, apps Apps, d Redeployer, log *slog.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if apps == nil || d == nil {
		return nil, errors.New("webhook: Apps and a Redeployer are required")
	}
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{cfg: cfg, apps: apps, deployer: d, log: log.WithGroup("webhook"),
		queues: map[string]*queue{}, limiters: map[string]*rate.Limiter{}, seen: newSeenSet(cfg.Remember),
		bodies: newSeenSet(cfg.Remember), quiet: map[string]bool{}}
	var err error
	if h.badSigs, err = sourcelimit.New(cfg.BadSignatures); err != nil {
		return nil, err
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h, nil
}

// Close stops taking deliveries and waits for the redeploys running to end, or for
// ctx; then it cancels them. Deliveries waiting behind them are dropped: the
// sender's redelivery, or the next push, asks again.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	for _, q := range h.queues {
		q.pending = nil
	}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
		h.cancel()
		return nil
	case <-ctx.Done():
		h.cancel()
		<-done
		return ctx.Err()
	}
}

// Answer is the JSON body of every answer that is not an error.
type Answer struct {
	Delivery string `json:"delivery"`
	// Result is queued (a redeploy starts), coalesced (it joins the one waiting),
	// duplicate (this delivery id, or this body with this signature, was seen),
	// ignored (see Reason) or pong.
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
}

// The results of a delivery.
const (
	ResultQueued    = "queued"
	ResultCoalesced = "coalesced"
	ResultDuplicate = "duplicate"
	ResultIgnored   = "ignored"
	ResultPong      = "pong"
)

// ServeHTTP takes one delivery.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	app, ok := strings.CutPrefix(r.URL.Path, h.cfg.Prefix)
	remote := r.RemoteAddr
	source := h.source(r)
	reject := func(code int, msg, why string, attrs ...any) {
		// The sender sees the status and a short word; the log says why.
		h.log.Warn("delivery rejected", append([]any{"app", app, "remote", remote, "source", source, "forwardedFor", r.Header.Get("X-Forwarded-For"), "status", code, "why", why}, attrs...)...)
		writeJSON(w, code, map[string]string{"error": msg})
	}
	if !ok || !appv1.ValidAppName(app) {
		reject(http.StatusNotFound, "no webhook here", "not an app path")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reject(http.StatusMethodNotAllowed, "POST only", "method "+r.Method)
		return
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		reject(http.StatusRequestEntityTooLarge, "body too large", "declared length", "bytes", r.ContentLength)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, h.cfg.MaxBodyBytes+1))
	if err != nil {
		reject(http.StatusBadRequest, "unreadable body", err.Error())
		return
	}
	if int64(len(body)) > h.cfg.MaxBodyBytes {
		reject(http.StatusRequestEntityTooLarge, "body too large", "body over the limit", "limit", h.cfg.MaxBodyBytes)
		return
	}

	lookup, cancel := context.WithTimeout(r.Context(), h.cfg.LookupTimeout)
	hook, err := h.apps.Hook(lookup, app)
	cancel()
	switch {
	case err == nil && len(hook.Secrets) == 0, errors.Is(err, backend.ErrNotFound):
		reject(http.StatusNotFound, "no webhook here", "unknown app or no webhook secret")
		return
	case err != nil:
		h.log.Error("hook lookup failed", "app", app, "remote", remote, "err", err)
		writeJSON(w, statusOf(err), map[string]string{"error": "try again"})
		return
	}
	provider := identify(r.Header)
	if !Verify(provider, r.Header, body, hook.Secrets) {
		if wait, limited := h.badSignature(source); limited {
			// Not logged: past the limit the source is logged once, by badSignature.
			w.Header().Set("Retry-After", strconv.Itoa(wait))
			writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "too many bad signatures"})
			return
		}
		reject(http.StatusUnauthorized, "unauthorized", "missing or wrong signature", "provider", provider)
		return
	}
	// A replay is the same body with the same signature, whatever delivery id it
	// carries: git hosts sign each delivery's body, and the body of a push names
	// its commits. The key is remembered beside the delivery ids.
	content := sha256.New()
	content.Write(body)
	content.Write([]byte{0})
	content.Write([]byte(signatureOf(provider, r.Header)))
	replay := app + "\x00body\x00" + hex.EncodeToString(content.Sum(nil))

	ev, err := parse(provider, r.Header, body)
	if err != nil {
		reject(http.StatusBadRequest, "malformed payload", err.Error(), "provider", provider)
		return
	}
	log := h.log.With("app", app, "provider", provider, "delivery", ev.delivery, "event", ev.kind, "remote", remote)
	answer := Answer{Delivery: ev.delivery}
	branch := hook.DeployBranch
	if branch == "" {
		branch = "main"
	}
	switch {
	case ev.kind == "ping":
		answer.Result = ResultPong
		log.Info("delivery", "result", answer.Result)
		writeJSON(w, http.StatusOK, answer)
		return
	case ev.kind != "push":
		answer.Result, answer.Reason = ResultIgnored, fmt.Sprintf("event %q does not deploy: only a push to %s does", ev.kind, branch)
	case ev.ref != "" && ev.ref != "refs/heads/"+branch:
		answer.Result, answer.Reason = ResultIgnored, fmt.Sprintf("%s is not the deploy branch refs/heads/%s", ev.ref, branch)
	case ev.deleted:
		answer.Result, answer.Reason = ResultIgnored, fmt.Sprintf("the push deleted %s: nothing to build", ev.ref)
	}
	if answer.Result != "" {
		log.Info("delivery", "result", answer.Result, "reason", answer.Reason)
		writeJSON(w, http.StatusAccepted, answer)
		return
	}

	code, answer := h.enqueue(Redeploy{App: app, Delivery: ev.delivery, Provider: provider, Commit: ev.after}, ev.dedup, replay)
	if code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	if code >= 400 {
		reject(code, answer.Reason, answer.Result, "provider", provider, "delivery", ev.delivery)
		return
	}
	log.Info("delivery", "result", answer.Result, "commit", ev.after)
	writeJSON(w, code, answer)
}

// enqueue starts a redeploy of r.App, or folds r into the one waiting behind the
// running one. It returns the status and answer.
func (h *Handler) enqueue(r Redeploy, dedup bool, replay string) (int, Answer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a := Answer{Delivery: r.Delivery}
	key := r.App + "\x00" + string(r.Provider) + "\x00" + r.Delivery
	if dedup && h.seen.has(key) {
		a.Result, a.Reason = ResultDuplicate, "this delivery was taken before"
		return http.StatusOK, a
	}
	if h.bodies.has(replay) {
		a.Result, a.Reason = ResultDuplicate, "this body with this signature was taken before"
		return http.StatusOK, a
	}
	if h.closed {
		return http.StatusServiceUnavailable, Answer{Delivery: r.Delivery, Result: "closing", Reason: "shutting down"}
	}
	lim := h.limiters[r.App]
	if lim == nil {
		lim = rate.NewLimiter(h.cfg.Rate, h.cfg.Burst)
		h.limiters[r.App] = lim
	}
	if !lim.Allow() {
		return http.StatusTooManyRequests, Answer{Delivery: r.Delivery, Result: "rate limited", Reason: "too many deliveries"}
	}
	q := h.queues[r.App]
	if q == nil && len(h.queues) >= h.cfg.MaxWaiting {
		return http.StatusServiceUnavailable, Answer{Delivery: r.Delivery, Result: "queue full", Reason: "too many redeploys waiting"}
	}
	if dedup {
		h.seen.add(key)
	}
	h.bodies.add(replay)
	if q != nil {
		// A redeploy runs: this delivery joins the one that follows it. The newest
		// delivery names it; the ones it replaces are listed.
		if q.pending != nil {
			r.Coalesced = append(append(q.pending.Coalesced, q.pending.Delivery), r.Coalesced...)
		}
		q.pending = &r
		a.Result = ResultCoalesced
		return http.StatusAccepted, a
	}
	h.queues[r.App] = &queue{}
	h.wg.Add(1)
	go h.work(r)
	a.Result = ResultQueued
	return http.StatusAccepted, a
}

// badSignature counts a bad signature from source: limited when the source is
// past its bucket, with the seconds to wait.
func (h *Handler) badSignature(source string) (wait int, limited bool) {
	a, after := h.badSigs.Begin(source)
	h.mu.Lock()
	defer h.mu.Unlock()
	if a != nil {
		a.Failed()
		delete(h.quiet, source)
		return 0, false
	}
	if !h.quiet[source] {
		// The first refusal of a run is logged; the next ones are not.
		if len(h.quiet) >= h.cfg.BadSignatures.MaxSources {
			clear(h.quiet)
		}
		h.quiet[source] = true
		h.log.Warn("bad signatures rate-limited", "source", source, "burst", h.cfg.BadSignatures.Burst)
	}
	return int(math.Ceil(after.Seconds())), true
}

// source is who a request is counted under: its client (clientaddr: the peer,
// or behind a trusted proxy, by address or by ProxySecret, the address it
// names), an IPv6 address by its /64.
func (h *Handler) source(r *http.Request) string {
	return sourcelimit.Source(h.cfg.TrustedProxies.OfProxiedRequest(r, h.cfg.ProxySecret))
}

// queue is an app's redeploys: one running (its presence in Handler.queues) and at
// most one waiting, which the deliveries during the run coalesce into.
type queue struct {
	pending *Redeploy
}

// work runs r, then whatever coalesced behind it, until nothing waits.
func (h *Handler) work(r Redeploy) {
	defer h.wg.Done()
	for {
		h.run(r)
		h.mu.Lock()
		q := h.queues[r.App]
		if q.pending == nil {
			delete(h.queues, r.App)
			h.mu.Unlock()
			return
		}
		r, q.pending = *q.pending, nil
		h.mu.Unlock()
	}
}

// statusOf is the HTTP status of an error, by its kind: the one mapping of
// the backend's kinds to statuses. A delivery is answered before its redeploy
// runs, so only the hook lookup's errors reach a sender; an internal one is
// "try again later" (503), which git hosts retry.
func statusOf(err error) int {
	switch backend.KindOf(err) {
	case backend.NotFound:
		return http.StatusNotFound
	case backend.Forbidden:
		return http.StatusForbidden
	case backend.Invalid:
		return http.StatusBadRequest
	case backend.Conflict:
		return http.StatusConflict
	case backend.Failed:
		return http.StatusBadGateway
	}
	return http.StatusServiceUnavailable
}

func (h *Handler) run(r Redeploy) {
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.DeployTimeout)
	defer cancel()
	start := time.Now()
	log := h.log.With("app", r.App, "delivery", r.Delivery, "provider", r.Provider)
	if len(r.Coalesced) > 0 {
		log = log.With("coalesced", r.Coalesced)
	}
	if err := h.deployer.Redeploy(ctx, r); err != nil {
		log.Warn("redeploy failed", "err", err, "took", time.Since(start))
		return
	}
	log.Info("redeployed", "took", time.Since(start))
}

// event is what a delivery asks for.
type event struct {
	kind     string // push, ping, or the provider's name of another event
	delivery string
	dedup    bool // the sender gave a delivery id
	ref      string
	after    string
	deleted  bool
}

// pushPayload is the part of a push event bex reads; GitHub, Gitea, Forgejo and
// GitLab agree on these fields.
type pushPayload struct {
	Ref     string `json:"ref"`
	After   string `json:"after"`
	Deleted bool   `json:"deleted"`
}

const zeroCommit = "0000000000000000000000000000000000000000"

func parse(p Provider, h http.Header, body []byte) (event, error) {
	var ev event
	switch p {
	case GitHub:
		ev.kind, ev.delivery = h.Get("X-GitHub-Event"), h.Get("X-GitHub-Delivery")
	case Gitea:
		ev.kind, ev.delivery = h.Get("X-Gitea-Event"), h.Get("X-Gitea-Delivery")
	case Forgejo:
		ev.kind, ev.delivery = h.Get("X-Forgejo-Event"), h.Get("X-Forgejo-Delivery")
	case GitLab:
		ev.kind, ev.delivery = h.Get("X-Gitlab-Event"), h.Get("X-Gitlab-Event-UUID")
		if ev.delivery == "" {
			ev.delivery = h.Get("Idempotency-Key")
		}
		if ev.kind == "Push Hook" {
			ev.kind = "push"
		}
	case Generic:
		ev.kind, ev.delivery = h.Get(HeaderEvent), h.Get(HeaderDelivery)
		if ev.kind == "" {
			ev.kind = "push"
		}
	}
	ev.dedup = ev.delivery != ""
	if len(ev.delivery) > 128 {
		return ev, errors.New("delivery id longer than 128 bytes")
	}
	if !ev.dedup {
		var b [8]byte
		_, _ = rand.Read(b[:])
		ev.delivery = "bex-" + hex.EncodeToString(b[:])
	}
	if p == Generic && len(strings.TrimSpace(string(body))) == 0 {
		// curl -X POST with a signature of the empty body: redeploy the branch.
		return ev, nil
	}
	// GitHub may send its payload form-encoded (content type
	// application/x-www-form-urlencoded): the JSON is the field "payload". The
	// signature covers the body as sent.
	if ct, _, _ := mime.ParseMediaType(h.Get("Content-Type")); ct == "application/x-www-form-urlencoded" {
		form, err := url.ParseQuery(string(body))
		if err != nil || form.Get("payload") == "" {
			return ev, errors.New("form-encoded body without a payload field")
		}
		body = []byte(form.Get("payload"))
	}
	if ev.kind != "push" {
		// Only a push is read further, but every body must be JSON.
		if !json.Valid(body) {
			return ev, errors.New("body is not JSON")
		}
		return ev, nil
	}
	var pl pushPayload
	if err := json.Unmarshal(body, &pl); err != nil {
		return ev, fmt.Errorf("push payload: %v", err)
	}
	if pl.Ref == "" && p != Generic {
		return ev, errors.New("push payload without a ref")
	}
	ev.ref, ev.after = pl.Ref, pl.After
	ev.deleted = pl.Deleted || pl.After == zeroCommit
	return ev, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// seenSet remembers the last n delivery keys.
type seenSet struct {
	keys map[string]struct{}
	ring []string
	next int
}

func newSeenSet(n int) *seenSet {
	return &seenSet{keys: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (s *seenSet) has(k string) bool { _, ok := s.keys[k]; return ok }

func (s *seenSet) add(k string) {
	if old := s.ring[s.next]; old != "" {
		delete(s.keys, old)
	}
	s.ring[s.next] = k
	s.keys[k] = struct{}{}
	s.next = (s.next + 1) % len(s.ring)
}
