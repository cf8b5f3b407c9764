package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

// fakeApps has one app with a hook, "shop" (deploy branch main), and "nohook",
// an app without a secret.
type fakeApps struct{ secrets [][]byte }

func (a *fakeApps) Hook(_ context.Context, app string) (*backend.Hook, error) {
	switch app {
	case "shop":
		return &backend.Hook{App: app, DeployBranch: "main", Secrets: a.secrets}, nil
	case "feature":
		return &backend.Hook{App: app, DeployBranch: "feature/x", Secrets: a.secrets}, nil
	case "nohook":
		return &backend.Hook{App: app}, nil
	}
	return nil, backend.Errorf(backend.NotFound, "no app %q", app)
}

// fakeRedeployer records redeploys; while block is open, each waits on it.
type fakeRedeployer struct {
	mu      sync.Mutex
	got     []Redeploy
	started chan Redeploy
	block   chan struct{}
}

func (d *fakeRedeployer) Redeploy(ctx context.Context, r Redeploy) error {
	d.mu.Lock()
	d.got = append(d.got, r)
	d.mu.Unlock()
	if d.started != nil {
		d.started <- r
	}
	if d.block != nil {
		select {
		case <-d.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (d *fakeRedeployer) calls() []Redeploy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Redeploy(nil), d.got...)
}

type fixture struct {
	t   *testing.T
	h   *Handler
	d   *fakeRedeployer
	log *bytes.Buffer
	mu  *sync.Mutex
}

var secret = []byte("hook-secret")

func newFixture(t *testing.T, cfg Config, d *fakeRedeployer) *fixture {
	t.Helper()
	var buf bytes.Buffer
	mu := &sync.Mutex{}
	h, err := New(cfg, &fakeApps{secrets: [][]byte{secret}}, d, slog.New(slog.NewTextHandler(lockedWriter{mu, &buf}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d.block != nil {
			select {
			case <-d.block:
			default:
				close(d.block)
			}
		}
		h.Close(context.Background())
	})
	return &fixture{t: t, h: h, d: d, log: &buf, mu: mu}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (f *fixture) logs() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.log.String()
}

// github sends a delivery as GitHub does, signed with secret.
func (f *fixture) github(app, event, delivery, body string) *httptest.ResponseRecorder {
	return f.post(app, body, map[string]string{
		"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "Content-Type": "application/json",
		HeaderGitHubSignature: Sign(secret, []byte(body)),
	})
}

func (f *fixture) post(app, body string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/hooks/"+app, strings.NewReader(body))
	req.RemoteAddr = "192.0.2.7:4711"
	for k, v := range header {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	return w
}

func answer(t *testing.T, w *httptest.ResponseRecorder) Answer {
	t.Helper()
	var a Answer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("answer %q: %v", w.Body.String(), err)
	}
	return a
}

func push(ref, after string) string {
	return fmt.Sprintf(`{"ref":%q,"before":"%s","after":%q,"repository":{"full_name":"o/shop"}}`, ref, strings.Repeat("0", 40), after)
}

func commit(n int) string { return fmt.Sprintf("%040x", n) }

func TestBadInput(t *testing.T) {
	cfg := DefaultConfig()
	f := newFixture(t, cfg, &fakeRedeployer{})
	good := push("refs/heads/main", commit(1))
	big := strings.Repeat(" ", int(cfg.MaxBodyBytes)+1)
	for _, tc := range []struct {
		name   string
		app    string
		body   string
		header map[string]string
		code   int
	}{
		{"no signature", "shop", good, map[string]string{"X-GitHub-Event": "push"}, 401},
		{"wrong signature", "shop", good, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign([]byte("other"), []byte(good))}, 401},
		{"signature of another body", "shop", good, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign(secret, []byte(good+" "))}, 401},
		{"gitlab wrong token", "shop", good, map[string]string{"X-Gitlab-Event": "Push Hook", HeaderGitLabToken: "hook-secreT"}, 401},
		{"unknown app", "nope", good, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign(secret, []byte(good))}, 404},
		{"app without a webhook secret", "nohook", good, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign(secret, []byte(good))}, 404},
		{"not an app name", "Shop", good, nil, 404},
		{"too large", "shop", big, map[string]string{HeaderGitHubSignature: Sign(secret, []byte(big))}, 413},
		{"malformed JSON", "shop", `{"ref":`, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign(secret, []byte(`{"ref":`))}, 400},
		{"push without a ref", "shop", `{}`, map[string]string{"X-GitHub-Event": "push", HeaderGitHubSignature: Sign(secret, []byte(`{}`))}, 400},
		{"malformed JSON of another event", "shop", `nope`, map[string]string{"X-GitHub-Event": "issues", HeaderGitHubSignature: Sign(secret, []byte(`nope`))}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := f.post(tc.app, tc.body, tc.header)
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.code, w.Body.String())
			}
			// No detail on why: a bad signature and a missing one look alike.
			if tc.code == 401 && strings.TrimSpace(w.Body.String()) != `{"error":"unauthorized"}` {
				t.Fatalf("401 body %q", w.Body.String())
			}
		})
	}
	req := httptest.NewRequest(http.MethodGet, "/hooks/shop", nil)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", w.Code)
	}
	// Every rejection is logged with the source address.
	if n := strings.Count(f.logs(), `remote=192.0.2.7:4711`); n < 11 {
		t.Fatalf("%d rejections logged with the source address:\n%s", n, f.logs())
	}
	if calls := f.d.calls(); len(calls) != 0 {
		t.Fatalf("bad input deployed: %+v", calls)
	}
}

func TestEvents(t *testing.T) {
	d := &fakeRedeployer{started: make(chan Redeploy, 10)}
	f := newFixture(t, DefaultConfig(), d)

	w := f.github("shop", "ping", "p1", `{"zen":"Keep it logically awesome.","hook_id":1}`)
	if a := answer(t, w); w.Code != 200 || a.Result != ResultPong || a.Delivery != "p1" {
		t.Fatalf("ping: %d %+v", w.Code, a)
	}
	w = f.github("shop", "issues", "i1", `{"action":"opened"}`)
	if a := answer(t, w); w.Code != 202 || a.Result != ResultIgnored || !strings.Contains(a.Reason, `event "issues" does not deploy`) {
		t.Fatalf("issues: %d %+v", w.Code, a)
	}
	w = f.github("shop", "push", "b1", push("refs/heads/dev", commit(1)))
	if a := answer(t, w); w.Code != 202 || a.Result != ResultIgnored || a.Reason != "refs/heads/dev is not the deploy branch refs/heads/main" {
		t.Fatalf("other branch: %d %+v", w.Code, a)
	}
	w = f.github("shop", "push", "t1", push("refs/tags/main", commit(1)))
	if a := answer(t, w); w.Code != 202 || a.Result != ResultIgnored {
		t.Fatalf("a tag named like the branch: %d %+v", w.Code, a)
	}
	// The exact full ref: refs/heads/feature/x is not x, and x is not feature/x.
	w = f.github("feature", "push", "f1", push("refs/heads/x", commit(1)))
	if a := answer(t, w); w.Code != 202 || a.Result != ResultIgnored {
		t.Fatalf("x for feature/x: %d %+v", w.Code, a)
	}
	w = f.github("shop", "push", "del", `{"ref":"refs/heads/main","after":"`+zeroCommit+`","deleted":true}`)
	if a := answer(t, w); w.Code != 202 || a.Result != ResultIgnored || !strings.Contains(a.Reason, "deleted") {
		t.Fatalf("deleted branch: %d %+v", w.Code, a)
	}
	if calls := d.calls(); len(calls) != 0 {
		t.Fatalf("ignored events deployed: %+v", calls)
	}

	// A push to the deploy branch, from each provider. Each body names its
	// provider: the same body with the same signature would be a replay.
	for _, tc := range []struct {
		provider Provider
		header   func(mac string) map[string]string
	}{
		{GitHub, func(mac string) map[string]string {
			return map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": "gh-1", HeaderGitHubSignature: mac}
		}},
		{Gitea, func(mac string) map[string]string {
			return map[string]string{"X-Gitea-Event": "push", "X-Gitea-Delivery": "gt-1", HeaderGiteaSignature: mac[7:], "X-GitHub-Event": "push", HeaderGitHubSignature: mac}
		}},
		{Forgejo, func(mac string) map[string]string {
			return map[string]string{"X-Forgejo-Event": "push", "X-Forgejo-Delivery": "fj-1", HeaderForgejoSignature: mac[7:]}
		}},
		{GitLab, func(string) map[string]string {
			return map[string]string{"X-Gitlab-Event": "Push Hook", "X-Gitlab-Event-UUID": "gl-1", HeaderGitLabToken: string(secret)}
		}},
		{Generic, func(mac string) map[string]string {
			return map[string]string{HeaderDelivery: "ci-1", HeaderSignature: mac}
		}},
	} {
		body := strings.Replace(push("refs/heads/main", commit(7)), `"o/shop"`, `"o/shop-`+string(tc.provider)+`"`, 1)
		header := tc.header(Sign(secret, []byte(body)))
		w := f.post("feature", body, header) // deploy branch feature/x: ignored, but verified and parsed
		if w.Code != 202 || answer(t, w).Result != ResultIgnored {
			t.Fatalf("%s to another branch: %d %s", tc.provider, w.Code, w.Body.String())
		}
		w = f.post("shop", body, header)
		a := answer(t, w)
		if w.Code != 202 || a.Result != ResultQueued {
			t.Fatalf("%s push: %d %+v", tc.provider, w.Code, a)
		}
		r := <-d.started
		if r.Provider != tc.provider || r.Delivery != a.Delivery || r.Commit != commit(7) || r.App != "shop" {
			t.Fatalf("%s redeploy: %+v", tc.provider, r)
		}
		waitIdle(t, f.h, "shop")
	}
	// GitHub's form-encoded content type: the JSON is the field "payload".
	form := "payload=" + url.QueryEscape(push("refs/heads/main", commit(7)))
	w = f.post("shop", form, map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": "form-1",
		"Content-Type": "application/x-www-form-urlencoded", HeaderGitHubSignature: Sign(secret, []byte(form))})
	if w.Code != 202 || answer(t, w).Result != ResultQueued {
		t.Fatalf("form-encoded push: %d %s", w.Code, w.Body.String())
	}
	<-d.started
	waitIdle(t, f.h, "shop")
	// The generic form with an empty body (curl): redeploy the deploy branch.
	w = f.post("shop", "", map[string]string{HeaderSignature: Sign(secret, nil)})
	if a := answer(t, w); w.Code != 202 || a.Result != ResultQueued || !strings.HasPrefix(a.Delivery, "bex-") {
		t.Fatalf("generic empty body: %d %+v", w.Code, a)
	}
	<-d.started
}

// waitIdle waits until app has no redeploy running.
func waitIdle(t *testing.T, h *Handler, app string) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, app+" idle", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, busy := h.queues[app]; busy {
			return errors.New("a redeploy runs")
		}
		return nil
	})
}

// TestCoalescing: three deliveries during one build make exactly one more build,
// named by the newest delivery; a replayed delivery id makes none.
func TestCoalescing(t *testing.T) {
	d := &fakeRedeployer{started: make(chan Redeploy, 10), block: make(chan struct{})}
	f := newFixture(t, DefaultConfig(), d)
	if a := answer(t, f.github("shop", "push", "d1", push("refs/heads/main", commit(1)))); a.Result != ResultQueued {
		t.Fatalf("first: %+v", a)
	}
	<-d.started // the build of d1 runs, and blocks
	for i := 2; i <= 4; i++ {
		start := time.Now()
		w := f.github("shop", "push", fmt.Sprintf("d%d", i), push("refs/heads/main", commit(i)))
		if a := answer(t, w); w.Code != 202 || a.Result != ResultCoalesced {
			t.Fatalf("delivery %d during the build: %d %+v", i, w.Code, a)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("the answer took %s during a build", took)
		}
	}
	// Replays: of the running one, of a coalesced one.
	for _, id := range []string{"d1", "d3"} {
		w := f.github("shop", "push", id, push("refs/heads/main", commit(9)))
		if a := answer(t, w); w.Code != 200 || a.Result != ResultDuplicate {
			t.Fatalf("replay of %s: %d %+v", id, w.Code, a)
		}
	}
	d.block <- struct{}{} // d1's build ends
	r := <-d.started
	if r.Delivery != "d4" || r.Commit != commit(4) || strings.Join(r.Coalesced, ",") != "d2,d3" {
		t.Fatalf("the build after: %+v", r)
	}
	close(d.block)
	waitIdle(t, f.h, "shop")
	if calls := d.calls(); len(calls) != 2 {
		t.Fatalf("%d builds, want 2: %+v", len(calls), calls)
	}
	// After the builds, a replay still makes no build.
	w := f.github("shop", "push", "d4", push("refs/heads/main", commit(4)))
	if a := answer(t, w); a.Result != ResultDuplicate {
		t.Fatalf("replay after the builds: %+v", a)
	}
	waitIdle(t, f.h, "shop")
	if calls := d.calls(); len(calls) != 2 {
		t.Fatalf("a replay built: %+v", calls)
	}
}

func TestRateLimitAndQueueBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rate, cfg.Burst, cfg.MaxWaiting = rate.Every(time.Hour), 3, 1
	d := &fakeRedeployer{block: make(chan struct{})}
	f := newFixture(t, cfg, d)
	for i := 1; i <= 3; i++ {
		if w := f.github("shop", "push", fmt.Sprint(i), push("refs/heads/main", commit(i))); w.Code != 202 {
			t.Fatalf("delivery %d: %d", i, w.Code)
		}
	}
	w := f.github("shop", "push", "4", push("refs/heads/main", commit(4)))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("past the rate: %d %v", w.Code, w.Header())
	}
	// A rate-limited delivery is not remembered: its redelivery is taken later.
	f.h.mu.Lock()
	f.h.limiters["shop"] = rate.NewLimiter(rate.Inf, 1)
	f.h.mu.Unlock()
	if w := f.github("shop", "push", "4", push("refs/heads/main", commit(4))); w.Code != 202 {
		t.Fatalf("redelivery after a 429: %d %s", w.Code, w.Body.String())
	}
	// One app is waiting (MaxWaiting 1): another app's delivery is refused.
	w = f.github("feature", "push", "x", push("refs/heads/feature/x", commit(1)))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("past the waiting bound: %d %s", w.Code, w.Body.String())
	}
	if !strings.Contains(f.logs(), "status=429") || !strings.Contains(f.logs(), "status=503") {
		t.Fatalf("rejections not logged:\n%s", f.logs())
	}
}

func TestSeenSetIsBounded(t *testing.T) {
	s := newSeenSet(3)
	for i := 0; i < 5; i++ {
		s.add(fmt.Sprint(i))
	}
	if s.has("0") || s.has("1") || !s.has("2") || !s.has("4") || len(s.keys) != 3 {
		t.Fatalf("%v", s.keys)
	}
}
