package gitserver_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// fakeDisk is a file system whose free space the test sets.
type fakeDisk struct{ free, total atomic.Uint64 }

func (d *fakeDisk) space(string) (uint64, uint64, error) { return d.free.Load(), d.total.Load(), nil }

// TestShortDiskRefusesPushesAndDeploysAtOnce: with less than the margin free, a
// push is refused before its pack, with one line saying how much is free, and a
// Deploy before its build; the margin is the smaller of 1 GiB and 5%, and with
// room again the same push goes through.
func TestShortDiskRefusesPushesAndDeploysAtOnce(t *testing.T) {
	disk := &fakeDisk{}
	disk.free.Store(4 << 30)
	disk.total.Store(100 << 30)
	e := newEnv(t, func(c *config) { c.FreeSpace = disk.space })
	u := e.addUser("ana", appv1.RoleAdmin, true)
	dir := u.workdir("short")
	first := strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
	u.mustGit(dir, "push", "-q", "bex", "main")

	// 612 MiB of 100 GiB: under 1 GiB (5% would be 5 GiB; the smaller counts).
	disk.free.Store(612 << 20)
	second := u.commit(dir, "app.txt", "v2\n")
	out, err := u.git(dir, "push", "bex", "main")
	want := "the disk of " + e.state + " has 612 MiB free (under the 1.0 GiB bex keeps): free space on it and push again (" + pipeline.WhereToLook + ")"
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("push on a short disk: err %v, want the line %q:\n%s", err, want, out)
	}
	if got := e.remoteRef("short", "refs/heads/main"); got != first {
		t.Fatalf("main = %s after the refused push, want the old %s", got, first)
	}
	if n := len(e.builder.all()); n != 1 {
		t.Fatalf("%d builds, want only the first push's", n)
	}
	_, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "short", Cause: pipeline.CauseDeploy, Actor: "ana"}, nil)
	if err == nil || backend.KindOf(err) != backend.Invalid || !strings.Contains(err.Error(), "has 612 MiB free") || !strings.Contains(err.Error(), "deploy again") {
		t.Fatalf("Deploy on a short disk: %v (kind %v)", err, backend.KindOf(err))
	}
	if n := len(e.builder.all()); n != 1 {
		t.Fatalf("%d builds after the refused Deploy, want 1", n)
	}

	// 600 MiB of a 10 GiB disk is above its margin, 5% (512 MiB): the push goes.
	disk.free.Store(600 << 20)
	disk.total.Store(10 << 30)
	u.mustGit(dir, "push", "-q", "bex", "main")
	if got := e.remoteRef("short", "refs/heads/main"); got != second {
		t.Fatalf("main = %s with room again, want %s", got, second)
	}
}

// smallFS mounts a tmpfs of size bytes (the kernel's own ENOSPC, not a fake)
// and unmounts it when the test ends, after the server (registered later) stops.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a %s tmpfs (the test needs root): %v\n%s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// fill writes a file of zeros leaving about leave bytes free on dir's file
// system, and returns its path.
func fill(t *testing.T, dir string, leave uint64) string {
	t.Helper()
	free, _, err := pipeline.Statfs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if free <= leave {
		t.Fatalf("only %d bytes free, cannot leave %d", free, leave)
	}
	path := filepath.Join(dir, "filler")
	if err := os.WriteFile(path, make([]byte, free-leave), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// serverOnSmallFS is a gitserver whose state dir is a fresh 64 MiB tmpfs.
func serverOnSmallFS(t *testing.T, tweak func(*config)) *env {
	t.Helper()
	state := smallFS(t, "64m")
	e := newEnv(t, func(c *config) { c.StateDir = state; tweak(c) })
	e.state = state
	return e
}

// TestPushRefusedUnderTheMarginOfARealFileSystem: the margin is read from the
// kernel (statfs) of the real state dir.
func TestPushRefusedUnderTheMarginOfARealFileSystem(t *testing.T) {
	// Half of 64 MiB, 32 MiB, is smaller than 1 GiB: it is the margin.
	e := serverOnSmallFS(t, func(c *config) { c.MinFreePercent = 50 })
	u := e.addUser("ana", appv1.RoleAdmin, true)
	dir := u.workdir("tight")
	first := strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
	u.mustGit(dir, "push", "-q", "bex", "main")

	filler := fill(t, e.state, 20<<20)
	second := u.commit(dir, "app.txt", "v2\n")
	out, err := u.git(dir, "push", "bex", "main")
	if err == nil || !strings.Contains(out, "the disk of "+e.state+" has ") ||
		!strings.Contains(out, "MiB free (under the 32 MiB bex keeps): free space on it and push again") {
		t.Fatalf("push under the margin: err %v, want the free-space line:\n%s", err, out)
	}
	if got := e.remoteRef("tight", "refs/heads/main"); got != first {
		t.Fatalf("main = %s after the refused push, want %s", got, first)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	u.mustGit(dir, "push", "-q", "bex", "main")
	if got := e.remoteRef("tight", "refs/heads/main"); got != second {
		t.Fatalf("main = %s after freeing space, want %s", got, second)
	}
}

// TestDiskFillingDuringAPushLeavesTheRepositoryValid: with no margin, a push
// whose pack does not fit fails on the kernel's ENOSPC: the repository stays
// valid (git fsck), the ref unmoved, nothing is built, and once space is freed
// the same push goes through.
func TestDiskFillingDuringAPushLeavesTheRepositoryValid(t *testing.T) {
	e := serverOnSmallFS(t, func(c *config) { c.MinFreeBytes = 0 })
	u := e.addUser("ana", appv1.RoleAdmin, true)
	dir := u.workdir("fills")
	first := strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
	u.mustGit(dir, "push", "-q", "bex", "main")

	// 24 MiB of random bytes (git cannot compress them) against 8 MiB free.
	second := u.commit(dir, "big.bin", string(randomBytes(24<<20)))
	filler := fill(t, e.state, 8<<20)
	out, err := u.git(dir, "push", "bex", "main")
	if err == nil {
		t.Fatalf("a push larger than the free space succeeded:\n%s", out)
	}
	if want := "the disk of " + e.state + " filled up, so nothing was stored: free space on it and push again (" + pipeline.WhereToLook + ")"; !strings.Contains(out, want) {
		t.Fatalf("the push on a full disk does not say %q:\n%s", want, out)
	}
	if left, _ := filepath.Glob(filepath.Join(e.repoDir("fills"), "objects", "pack", "tmp_*")); len(left) > 0 {
		t.Fatalf("the failed push left %v", left)
	}
	u.mustGit(e.repoDir("fills"), "fsck", "--strict", "--no-dangling")
	if got := e.remoteRef("fills", "refs/heads/main"); got != first {
		t.Fatalf("main = %s after the failed push, want %s", got, first)
	}
	if n := len(e.builder.all()); n != 1 {
		t.Fatalf("%d builds, want only the first push's", n)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	u.mustGit(dir, "push", "-q", "bex", "main")
	if got := e.remoteRef("fills", "refs/heads/main"); got != second {
		t.Fatalf("main = %s after freeing space, want %s", got, second)
	}
	u.mustGit(e.repoDir("fills"), "fsck", "--strict", "--no-dangling")
}

// TestDiskFillingDuringAnUpstreamFetch: a Deploy whose fetch does not fit fails
// with the same line, builds nothing and moves no branch; with room it deploys.
func TestDiskFillingDuringAnUpstreamFetch(t *testing.T) {
	e := serverOnSmallFS(t, func(c *config) { c.MinFreeBytes = 0; c.AllowFileUpstreams = true })
	u := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("mirror")
	dir, url := u.upstream()
	tip := u.commit(dir, "big.bin", string(randomBytes(24<<20)))
	filler := fill(t, e.state, 8<<20)
	req := pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook, Actor: "webhook:test"}
	_, err := e.pl.Deploy(context.Background(), req, nil)
	if want := "the disk of " + e.state + " filled up, so nothing was stored"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Deploy on a full disk: %v, want %q", err, want)
	}
	if n := len(e.builder.all()); n != 0 {
		t.Fatalf("%d builds after the failed fetch", n)
	}
	u.mustGit(e.repoDir("mirror"), "fsck", "--strict", "--no-dangling")
	if got := e.remoteRef("mirror", "refs/heads/main"); got != "" {
		t.Fatalf("main = %s after the failed fetch", got)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pl.Deploy(context.Background(), req, nil); err != nil {
		t.Fatalf("Deploy after freeing space: %v", err)
	}
	if got := e.remoteRef("mirror", "refs/heads/main"); got != tip {
		t.Fatalf("main = %s after the deploy, want %s", got, tip)
	}
}

// randomBytes is n bytes git cannot compress.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
