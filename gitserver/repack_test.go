package gitserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

type repackResult struct {
	app     string
	skipped bool
	err     error
}

// repacks reports the server's background repacks.
func repacks(e *env) chan repackResult {
	ch := make(chan repackResult, 100)
	e.pl.OnRepack(func(app string, skipped bool, err error) { ch <- repackResult{app, skipped, err} })
	return ch
}

func nextRepack(t *testing.T, ch chan repackResult) repackResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no repack within 30s")
		return repackResult{}
	}
}

// packs counts the repository's packs and loose objects.
func packs(t *testing.T, repo string) (packs, loose int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repo, "objects", "pack", "*.pack"))
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(repo, "objects", "??"))
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		loose += len(entries)
	}
	return len(files), loose
}

func fsck(t *testing.T, repo string) {
	t.Helper()
	out, err := exec.Command("git", "--git-dir", repo, "fsck", "--full", "--strict").CombinedOutput()
	if err != nil {
		t.Fatalf("git fsck: %v\n%s", err, out)
	}
}

// Every push stores a pack; with the repository's gc.autoPackLimit low, the
// background `git gc --auto` after the pushes folds them into one, and the
// repository stays whole: fsck clean, every commit there, a clone works.
func TestPushesKeepTheRepositoryCompact(t *testing.T) {
	e := newEnv(t)
	done := repacks(e)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "-q", "bex", "main")
	if r := nextRepack(t, done); r.skipped || r.err != nil {
		t.Fatalf("first repack: %+v", r)
	}
	repo := e.repoDir("hello")
	// git's own knobs, in the repository's config: repack past 3 packs.
	if out, err := exec.Command("git", "--git-dir", repo, "config", "gc.autoPackLimit", "3").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var head string
	maxPacks := 0
	const pushes = 12
	for i := range pushes {
		head = admin.commit(dir, "app.txt", fmt.Sprintf("change %d\n", i))
		admin.mustGit(dir, "push", "-q", "bex", "main")
		if r := nextRepack(t, done); r.app != "hello" || r.skipped || r.err != nil {
			t.Fatalf("repack after push %d: %+v", i, r)
		}
		n, _ := packs(t, repo)
		maxPacks = max(maxPacks, n)
	}
	// Without repacks there would be one pack per push (13); with them, never
	// more than the limit, as gc --auto folds them once there are more than 3.
	if n, loose := packs(t, repo); maxPacks > 3 || n > 3 {
		t.Fatalf("packs after %d pushes: %d now, at most %d, %d loose objects", pushes, n, maxPacks, loose)
	}
	fsck(t, repo)
	if got := e.remoteRef("hello", "refs/heads/main"); got != head {
		t.Fatalf("main = %s, want %s", got, head)
	}
	count := strings.TrimSpace(admin.mustGit(repo, "--git-dir", repo, "rev-list", "--count", "main"))
	if count != fmt.Sprint(pushes+1) {
		t.Fatalf("%s commits on main, want %d", count, pushes+1)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	admin.mustGit(t.TempDir(), "clone", "-q", e.url("hello"), clone)
	if got := strings.TrimSpace(admin.mustGit(clone, "rev-parse", "HEAD")); got != head {
		t.Fatalf("clone HEAD = %s, want %s", got, head)
	}
}

// gitWrapper puts a git first on PATH that, for gc, says it started and waits on a
// fifo before it runs the real git: the test holds a repack in the middle.
func gitWrapper(t *testing.T) (started, release string) {
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	started, release = filepath.Join(bin, "started"), filepath.Join(bin, "release")
	if err := syscall.Mkfifo(release, 0o600); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
  if [ "$a" = gc ]; then
    : > %[1]q
    read x < %[2]q
    break
  fi
done
exec %[3]q "$@"
`, started, release, real)
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return started, release
}

// A push that comes while gc runs waits for it (the repack holds the app's lock),
// then lands: no push ever writes into a repository gc is rewriting.
func TestPushWaitsForARunningRepack(t *testing.T) {
	started, release := gitWrapper(t)
	e := newEnv(t, func(c *config) { c.LockWait = time.Minute })
	done := repacks(e)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "-q", "bex", "main")
	repo := e.repoDir("hello")
	// gc in this repository has real work to do once it may go on.
	if out, err := exec.Command("git", "--git-dir", repo, "config", "gc.autoPackLimit", "1").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	e.eventually(func() error {
		if _, err := os.Stat(started); err != nil {
			return fmt.Errorf("gc has not started: %v", err)
		}
		return nil
	})
	head := admin.commit(dir, "app.txt", "during gc\n")
	push := admin.gitCmd(dir, "push", "bex", "main")
	out := &testenv.SyncBuffer{}
	push.Stdout, push.Stderr = out, out
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	e.eventually(func() error {
		if !strings.Contains(out.String(), "Waiting for a repack of the app's repository to finish") {
			return fmt.Errorf("push output so far: %q", out.String())
		}
		return nil
	})
	if got := e.remoteRef("hello", "refs/heads/main"); got == head {
		t.Fatal("the ref moved while gc held the repository")
	}
	if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := nextRepack(t, done); r.skipped || r.err != nil {
		t.Fatalf("repack: %+v", r)
	}
	if err := push.Wait(); err != nil {
		t.Fatalf("push after gc: %v\n%s", err, out.String())
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != head {
		t.Fatalf("main = %s, want %s", got, head)
	}
	fsck(t, repo)
	// The push's own repack: held at the fifo too, released, and clean.
	if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := nextRepack(t, done); r.skipped || r.err != nil {
		t.Fatalf("second repack: %+v", r)
	}
	fsck(t, repo)
}

// A repack never runs while a push holds the app's lock: it waits briefly, then
// skips (the next push asks again); git is not started.
func TestRepackSkipsWhileAPushHoldsTheLock(t *testing.T) {
	started, release := gitWrapper(t)
	e := newEnv(t)
	done := repacks(e)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "-q", "bex", "main")
	e.eventually(func() error {
		if _, err := os.Stat(started); err != nil {
			return fmt.Errorf("gc has not started: %v", err)
		}
		return nil
	})
	if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := nextRepack(t, done); r.skipped || r.err != nil {
		t.Fatalf("first repack: %+v", r)
	}
	if err := os.Remove(started); err != nil {
		t.Fatal(err)
	}

	building := make(chan struct{})
	proceed := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		close(building)
		<-proceed
		return nil
	})
	admin.commit(dir, "app.txt", "second\n")
	push := admin.gitCmd(dir, "push", "-q", "bex", "main")
	out := &testenv.SyncBuffer{}
	push.Stdout, push.Stderr = out, out
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	<-building
	e.pl.RepackLater("hello")
	if r := nextRepack(t, done); !r.skipped || r.err != nil {
		t.Fatalf("repack while a push builds: %+v, want skipped", r)
	}
	if _, err := os.Stat(started); err == nil {
		t.Fatal("git gc started while the push held the lock")
	}
	close(proceed)
	if err := push.Wait(); err != nil {
		t.Fatalf("push: %v\n%s", err, out.String())
	}
	// The control: the push's own repack, after it let go, runs.
	e.eventually(func() error {
		if _, err := os.Stat(started); err != nil {
			return fmt.Errorf("gc has not started after the push: %v", err)
		}
		return nil
	})
	if err := os.WriteFile(release, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := nextRepack(t, done); r.skipped || r.err != nil {
		t.Fatalf("repack after the push: %+v", r)
	}
	fsck(t, e.repoDir("hello"))
}

// system:prune's git gc (CompactRepository) takes the app's lock without
// waiting: while a push holds it, it returns ErrRepositoryBusy at once and
// touches nothing; once the push is done it runs, and the unreachable object
// goes at once (--prune=now), the repository fsck clean.
func TestCompactRepositoryNeverRunsUnderAPush(t *testing.T) {
	e := newEnv(t)
	done := repacks(e)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "-q", "bex", "main")
	if r := nextRepack(t, done); r.err != nil {
		t.Fatalf("the push's repack: %+v", r)
	}
	repo := e.repoDir("hello")
	hashCmd := exec.Command("git", "--git-dir", repo, "hash-object", "-w", "--stdin")
	hashCmd.Stdin = strings.NewReader("nobody points at this\n")
	hash, err := hashCmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(hash))
	garbage := filepath.Join(repo, "objects", id[:2], id[2:])
	if _, err := os.Stat(garbage); err != nil {
		t.Fatal(err)
	}

	building := make(chan struct{})
	proceed := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		close(building)
		<-proceed
		return nil
	})
	admin.commit(dir, "app.txt", "second\n")
	push := admin.gitCmd(dir, "push", "-q", "bex", "main")
	pushOut := &testenv.SyncBuffer{}
	push.Stdout, push.Stderr = pushOut, pushOut
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	<-building
	began := time.Now()
	if _, err := e.pl.CompactRepository(context.Background(), "hello"); !errors.Is(err, pipeline.ErrRepositoryBusy) {
		t.Fatalf("CompactRepository while a push builds: %v, want ErrRepositoryBusy", err)
	}
	// It gives a background repack a moment (2 s), never a push its whole build.
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("CompactRepository waited %s for the push's lock", d)
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Fatalf("the unreachable object went while the push held the lock: %v", err)
	}
	// The images' removal is held off alike.
	ran := false
	if err := e.pl.IfIdle("hello", "system:prune", func() error { ran = true; return nil }); !errors.Is(err, pipeline.ErrRepositoryBusy) || ran {
		t.Fatalf("IfIdle while a push builds: %v (ran: %v), want ErrRepositoryBusy", err, ran)
	}
	close(proceed)
	if err := push.Wait(); err != nil {
		t.Fatalf("push: %v\n%s", err, pushOut.String())
	}
	if r := nextRepack(t, done); r.err != nil {
		t.Fatalf("the second push's repack: %+v", r)
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Fatalf("gc --auto after the push removed the unreachable object (it keeps it two weeks): %v", err)
	}
	// The control: with the lock free, both run.
	if err := e.pl.IfIdle("hello", "system:prune", func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("IfIdle with the lock free: %v (ran: %v)", err, ran)
	}
	if _, err := e.pl.CompactRepository(context.Background(), "hello"); err != nil {
		t.Fatalf("CompactRepository: %v", err)
	}
	if _, err := os.Stat(garbage); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the unreachable object is still there after git gc --prune=now: %v", err)
	}
	fsck(t, repo)
}
