package builder_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/builder"
)

// signalWriter keeps what a build prints and closes seen once it holds want.
type signalWriter struct {
	mu   sync.Mutex
	b    strings.Builder
	want string
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if w.seen != nil && strings.Contains(w.b.String(), w.want) {
		close(w.seen)
		w.seen = nil
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// writeReady writes the file as bex up does: whole, by a rename.
func writeReady(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestBuildWithoutDockerfileWaitsForTheBases: with PlanBasesReady set (bex up
// --local-bases makes the stand-ins after it is up), a build with a generated
// Dockerfile that arrives first says it waits, and builds once the file appears;
// one whose file gives a reason fails with it and builds nothing; an app with its
// own Dockerfile does not wait. A build that waits holds no build slot: with one
// slot, a Dockerfile build runs meanwhile without waiting for it.
func TestBuildWithoutDockerfileWaitsForTheBases(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "local-bases.ready")
	b, _ := newBuilder(t, func(c *builder.Config) { c.PlanBasesReady = ready; c.MaxConcurrent = 1 })
	procfile := newRepo(t, map[string]string{"Procfile": "web: httpd -f -p $PORT\n", "serve.sh": "exec httpd -f\n"})

	t.Run("waits, then builds", func(t *testing.T) {
		out := &signalWriter{want: "Waiting for the base images", seen: make(chan struct{})}
		seen := out.seen
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		type result struct {
			res *builder.Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := b.Build(ctx, procfile.request("waiter"), out)
			done <- result{res, err}
		}()
		select {
		case <-seen:
		case r := <-done:
			t.Fatalf("the build ended before the bases were ready (%v):\n%s", r.err, out)
		}
		// The waiting build gave its slot back: this one takes it at once.
		own := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nCMD [\"true\"]\n"})
		if _, ownOut := mustBuild(t, b, own.request("meanwhile")); strings.Contains(ownOut, "Waiting for a build slot") {
			t.Errorf("a build waiting for the base images held the only slot:\n%s", ownOut)
		}
		writeReady(t, ready, "")
		r := <-done
		if r.err != nil {
			t.Fatalf("build: %v\n%s", r.err, out)
		}
		if r.res.Image == "" || !strings.Contains(out.String(), "The base images are ready") {
			t.Errorf("image %q; output:\n%s", r.res.Image, out)
		}
	})

	t.Run("a reason fails the build", func(t *testing.T) {
		writeReady(t, ready, "mmdebstrap: no space left on device\n")
		res, out, err := build(t, b, procfile.request("refused"))
		if err == nil || !strings.Contains(err.Error(), "could not be made: mmdebstrap: no space left on device") {
			t.Fatalf("got %v, %v; want the reason:\n%s", res, err, out)
		}
		if strings.Contains(out, "Built ") {
			t.Errorf("something was built:\n%s", out)
		}
	})

	t.Run("an own Dockerfile does not wait", func(t *testing.T) {
		if err := os.Remove(ready); err != nil {
			t.Fatal(err)
		}
		own := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nCMD [\"true\"]\n"})
		_, out := mustBuild(t, b, own.request("own"))
		if strings.Contains(out, "Waiting for the base images") {
			t.Errorf("a Dockerfile build waited:\n%s", out)
		}
	})
}
