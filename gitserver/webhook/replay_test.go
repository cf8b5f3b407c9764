package webhook

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// postFrom is post from the peer remote, with X-Forwarded-For xff when not empty.
func (f *fixture) postFrom(remote, xff, app, body string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/hooks/"+app, strings.NewReader(body))
	req.RemoteAddr = remote
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	return w
}

func TestAReplayedDeliveryIsNotQueuedAgain(t *testing.T) {
	f := newFixture(t, DefaultConfig(), &fakeRedeployer{})
	body := push("refs/heads/main", commit(1))
	if w := f.github("shop", "push", "id-1", body); w.Code != http.StatusAccepted || answer(t, w).Result != ResultQueued {
		t.Fatalf("first delivery: %d %s", w.Code, w.Body.String())
	}
	// The same body and signature under a new delivery id, and under none: an
	// attacker who saw the delivery once replays it.
	for _, id := range []string{"id-2", ""} {
		w := f.github("shop", "push", id, body)
		if w.Code != http.StatusOK || answer(t, w).Result != ResultDuplicate {
			t.Fatalf("replay with delivery id %q: %d %s", id, w.Code, w.Body.String())
		}
	}
	// GitLab signs nothing: its token with the same body is the replay.
	gitlab := map[string]string{"X-Gitlab-Event": "Push Hook", HeaderGitLabToken: string(secret), "X-Gitlab-Event-UUID": "gl-1"}
	if w := f.post("shop", push("refs/heads/main", commit(7)), gitlab); w.Code != http.StatusAccepted {
		t.Fatalf("gitlab delivery: %d %s", w.Code, w.Body.String())
	}
	gitlab["X-Gitlab-Event-UUID"] = "gl-2"
	if w := f.post("shop", push("refs/heads/main", commit(7)), gitlab); w.Code != http.StatusOK || answer(t, w).Result != ResultDuplicate {
		t.Fatalf("gitlab replay: %d %s", w.Code, w.Body.String())
	}

	// The generic form's empty body has one signature: the second is a replay too
	// (a CI job puts something of its own in the body, see docs/commands.md).
	if w := f.post("shop", "", map[string]string{HeaderSignature: Sign(secret, nil)}); w.Code != http.StatusAccepted {
		t.Fatalf("generic empty body: %d %s", w.Code, w.Body.String())
	}
	if w := f.post("shop", "", map[string]string{HeaderSignature: Sign(secret, nil)}); w.Code != http.StatusOK || answer(t, w).Result != ResultDuplicate {
		t.Fatalf("generic empty body again: %d %s", w.Code, w.Body.String())
	}
	ci := `{"ref":"refs/heads/main","id":"job-2"}`
	if w := f.post("shop", ci, map[string]string{HeaderSignature: Sign(secret, []byte(ci))}); w.Code != http.StatusAccepted {
		t.Fatalf("generic body with a job id: %d %s", w.Code, w.Body.String())
	}

	// Control: a fresh delivery is taken. The app's redeploys run in order, so
	// once it has run, a replay queued before it would have run too, or been
	// coalesced into it.
	if w := f.github("shop", "push", "id-3", push("refs/heads/main", commit(2))); w.Code != http.StatusAccepted {
		t.Fatalf("fresh delivery: %d %s", w.Code, w.Body.String())
	}
	testenv.Eventually(t, 10*time.Second, "the fresh delivery's redeploy", func() error {
		for _, c := range f.d.calls() {
			if c.Delivery == "id-3" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	// Five deliveries were taken (id-1, gl-1, the empty body, the CI job, id-3);
	// every replay would be one more, run or coalesced.
	var taken []string
	for _, c := range f.d.calls() {
		taken = append(append(taken, c.Delivery), c.Coalesced...)
	}
	if len(taken) != 5 || slices.Contains(taken, "id-2") || slices.Contains(taken, "gl-2") {
		t.Fatalf("deliveries deployed %v, want the five taken, no replay", taken)
	}
}

func TestBadSignaturesAreRateLimitedPerSource(t *testing.T) {
	f := newFixture(t, DefaultConfig(), &fakeRedeployer{})
	good := push("refs/heads/main", commit(1))
	bad := map[string]string{"X-GitHub-Event": "push", "X-GitHub-Delivery": "x", HeaderGitHubSignature: Sign([]byte("guess"), []byte(good))}
	limitedAfterTen := func(name, remote string, xff func(i int) string) {
		t.Helper()
		for i := range 10 {
			if w := f.postFrom(remote, xff(i), "shop", good, bad); w.Code != http.StatusUnauthorized {
				t.Fatalf("%s: bad signature %d: %d, want 401", name, i+1, w.Code)
			}
		}
		w := f.postFrom(remote, xff(10), "shop", good, bad)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "6" {
			t.Fatalf("%s: 11th bad signature: %d Retry-After %q, want 429 with Retry-After 6", name, w.Code, w.Header().Get("Retry-After"))
		}
	}
	none := func(int) string { return "" }

	limitedAfterTen("direct", "198.51.100.1:5000", none)
	// Another source still gets 401.
	if w := f.postFrom("198.51.100.2:5000", "", "shop", good, bad); w.Code != http.StatusUnauthorized {
		t.Fatalf("another source: %d, want 401", w.Code)
	}
	// A peer that is not a trusted proxy cannot escape by writing
	// X-Forwarded-For: it is counted under its own address (one used above).
	for i := range 9 {
		if w := f.postFrom("198.51.100.2:5000", "203.0.113."+strconv.Itoa(i+1), "shop", good, bad); w.Code != http.StatusUnauthorized {
			t.Fatalf("untrusted peer, bad signature %d: %d", i+2, w.Code)
		}
	}
	if w := f.postFrom("198.51.100.2:5000", "203.0.113.99", "shop", good, bad); w.Code != http.StatusTooManyRequests {
		t.Fatalf("untrusted peer with a new X-Forwarded-For each time: %d, want 429", w.Code)
	}
	// Behind the edge (a trusted proxy on 127.0.0.1), the source is the last hop of
	// X-Forwarded-For: the hops before it are the client's to write.
	limitedAfterTen("behind the edge", "127.0.0.1:40000", func(i int) string { return "10.9.8." + strconv.Itoa(i) + ", 203.0.113.9" })
	if w := f.postFrom("127.0.0.1:40001", "203.0.113.10", "shop", good, bad); w.Code != http.StatusUnauthorized {
		t.Fatalf("another client behind the edge: %d, want 401", w.Code)
	}
	// Control: a well-signed delivery is taken, from a limited source too.
	if w := f.postFrom("198.51.100.1:5000", "", "shop", good, map[string]string{
		"X-GitHub-Event": "push", "X-GitHub-Delivery": "ok-1", HeaderGitHubSignature: Sign(secret, []byte(good)),
	}); w.Code != http.StatusAccepted || answer(t, w).Result != ResultQueued {
		t.Fatalf("good delivery from a limited source: %d %s", w.Code, w.Body.String())
	}
	// The refusals past the limit are logged once per source, not one by one.
	if n := strings.Count(f.logs(), "bad signatures rate-limited"); n != 3 {
		t.Fatalf("%d rate-limit log lines, want 3 (one per limited source):\n%s", n, f.logs())
	}
}
