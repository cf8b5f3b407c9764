package builder_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
)

// warningDockerfile draws a BuildKit check warning (FromAsCasing: "as" in lower
// case after "FROM" in upper case), which the builder prints as " !     warning: …",
// the same prefix as its failures.
const warningDockerfile = "FROM busybox as base\n"

// only returns the one build of app that b has stored.
func only(t *testing.T, b *builder.Builder, app string) builder.BuildLog {
	t.Helper()
	logs, err := b.Logs(app)
	if err != nil || len(logs) != 1 {
		t.Fatalf("Logs(%s) = %+v, %v; want one build", app, logs, err)
	}
	one, err := b.BuildLog(app, logs[0].ID)
	if err != nil {
		t.Fatalf("BuildLog(%s, %s): %v", app, logs[0].ID, err)
	}
	if one != logs[0] {
		t.Fatalf("BuildLog = %+v, Logs says %+v", one, logs[0])
	}
	return one
}

func TestOutcomeOfASucceededBuild(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo built\n"})
	req := r.request("ok")
	before := time.Now()
	res, _ := mustBuild(t, b, req)
	l := only(t, b, "ok")
	if l.Outcome != builder.OutcomeSucceeded || l.Image != res.Image || l.Error != "" || l.Commit != req.Commit {
		t.Fatalf("record = %+v; want succeeded with image %s", l, res.Image)
	}
	if l.Time.Before(before.Add(-time.Second)) || l.Finished.Before(l.Time) || l.Finished.After(time.Now()) {
		t.Fatalf("began %s, finished %s: not within the build (from %s)", l.Time, l.Finished, before)
	}
}

// The bug this record replaces: the MCP server read a build's outcome from its log,
// and any line starting " !     " meant failed, so a build that printed a BuildKit
// warning read as failed while it ran. The record says what happened.
func TestABuildThatWarnsSucceeds(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": warningDockerfile + "RUN echo built\n"})
	_, out := mustBuild(t, b, r.request("warns"))
	if !strings.Contains("\n"+out, "\n !     warning: ") {
		t.Fatalf("the build printed no BuildKit warning, so it tests nothing:\n%s", out)
	}
	if l := only(t, b, "warns"); l.Outcome != builder.OutcomeSucceeded || l.Error != "" {
		t.Fatalf("record = %+v; want succeeded\n%s", l, out)
	}
}

func TestOutcomeOfAFailedBuild(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo about to fail && exit 3\n"})
	_, out, err := build(t, b, r.request("fails"))
	if err == nil {
		t.Fatalf("the build succeeded:\n%s", out)
	}
	l := only(t, b, "fails")
	// The one line the pusher was shown first, without the step's output.
	want := "step [2/2] RUN echo about to fail && exit 3 failed with exit code 3"
	if l.Outcome != builder.OutcomeFailed || l.Error != want || l.Image != "" || l.Finished.IsZero() {
		t.Fatalf("record = %+v; want failed with %q", l, want)
	}
	if !strings.Contains(out, " !     "+want) {
		t.Fatalf("the pusher was not shown %q:\n%s", want, out)
	}
}

// A build is running while it runs, even after printing a warning, and canceled
// when its caller's context ends.
func TestOutcomeWhileRunningAndWhenCanceled(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": warningDockerfile + "RUN echo started && sleep 120\n"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := b.Build(ctx, r.request("slow"), pw)
		pw.Close()
		errc <- err
	}()
	var seen strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), "       started") || !strings.Contains("\n"+seen.String(), "\n !     warning: ") {
		n, err := pr.Read(buf)
		if err != nil {
			t.Fatalf("the build ended before it started its RUN step and warned: %v\n%s", err, seen.String())
		}
		seen.Write(buf[:n])
	}
	go io.Copy(io.Discard, pr)
	if l := only(t, b, "slow"); l.Outcome != builder.OutcomeRunning || !l.Finished.IsZero() || l.Error != "" {
		t.Fatalf("record of a build in its RUN step = %+v; want running\n%s", l, seen.String())
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build returned %v", err)
	}
	if l := only(t, b, "slow"); l.Outcome != builder.OutcomeCanceled || l.Finished.IsZero() || l.Error != "" {
		t.Fatalf("record of a cancelled build = %+v; want canceled", l)
	}
}

func TestBuildLogOfAnUnknownOrInvalidBuild(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n"})
	mustBuild(t, b, r.request("known"))
	id := only(t, b, "known").ID
	other := "1-" + strings.Repeat("a", 40)
	if _, err := b.BuildLog("known", other); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("BuildLog of an unknown id = %v; want fs.ErrNotExist", err)
	}
	if _, err := b.BuildLog("unknown", id); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("BuildLog of an unknown app = %v; want fs.ErrNotExist", err)
	}
	if _, err := b.OpenLog("known", other); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("OpenLog of an unknown id = %v; want fs.ErrNotExist", err)
	}
	for _, bad := range [][2]string{{"../known", id}, {"known", "../known/" + id}, {"known", id + "/"}, {"", id}, {"known", ""}} {
		if _, err := b.BuildLog(bad[0], bad[1]); !errors.Is(err, builder.ErrInvalidName) {
			t.Errorf("BuildLog(%q, %q) = %v; want ErrInvalidName", bad[0], bad[1], err)
		}
		if _, err := b.OpenLog(bad[0], bad[1]); !errors.Is(err, builder.ErrInvalidName) {
			t.Errorf("OpenLog(%q, %q) = %v; want ErrInvalidName", bad[0], bad[1], err)
		}
	}
	if _, err := b.Logs("a/b"); !errors.Is(err, builder.ErrInvalidName) {
		t.Errorf("Logs(a/b) = %v; want ErrInvalidName", err)
	}
	req := r.request("../escape")
	if _, _, err := build(t, b, req); !errors.Is(err, builder.ErrInvalidName) {
		t.Errorf("a build of app ../escape = %v; want ErrInvalidName", err)
	}
}
