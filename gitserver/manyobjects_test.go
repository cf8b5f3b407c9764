package gitserver_test

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestAPushOverTheObjectLimitIsRefusedThenPushedInParts: with MaxPushObjects 30, a
// push of 48 objects is refused from its pack's header with one line that says
// what to do; no ref moves and nothing is built. Doing what it says (an older
// commit to another branch, then the rest) lands the history.
func TestAPushOverTheObjectLimitIsRefusedThenPushedInParts(t *testing.T) {
	e := newEnv(t, func(c *config) { c.MaxPushObjects = 30 })
	u := e.addUser("many", appv1.RoleMember, true)
	dir := u.workdir("many")
	u.mustGit(dir, "push", "-q", "bex", "main")
	first := e.remoteRef("many", "refs/heads/main")
	builds := len(e.builder.all())

	// Four commits of ten new files: 4 x (a commit, a tree, ten blobs). One file
	// is 8 MiB of random bytes, so that the pack is more than the SSH window and
	// the pipes hold: git is still writing it when the refusal comes.
	noise := make([]byte, 8<<20)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	for c := range 4 {
		for f := range 10 {
			content := []byte(fmt.Sprintf("file %d of commit %d\n", f, c))
			if c == 0 && f == 0 {
				content = noise
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file-%d-%d.txt", c, f)), content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		u.mustGit(dir, "add", ".")
		u.mustGit(dir, "commit", "-q", "-m", fmt.Sprintf("commit %d", c))
	}
	tip := strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
	res, err := u.git(dir, "push", "bex", "main")
	if err == nil {
		t.Fatalf("push accepted:\n%s", res)
	}
	t.Logf("git push:\n%s", res)
	line := "the push holds 48 objects, more than the limit of 30 per push: push older commits first (git push bex <older commit>:refs/heads/import, then the rest), or have the operator raise --max-push-objects"
	if !strings.Contains(res, "! [remote rejected] main -> main ("+line+")") {
		t.Fatalf("want the refusal %q, got:\n%s", line, res)
	}
	if got := e.remoteRef("many", "refs/heads/main"); got != first {
		t.Fatalf("main moved to %s", got)
	}
	if n := len(e.builder.all()); n != builds {
		t.Fatalf("%d builds after the refused push, want %d", n, builds)
	}
	if left, _ := filepath.Glob(filepath.Join(e.repoDir("many"), "objects", "pack", "tmp_*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}

	// In parts, as the line says: 24 objects, then the other 24.
	u.mustGit(dir, "push", "-q", "bex", "HEAD~2:refs/heads/import")
	u.mustGit(dir, "push", "-q", "bex", "main")
	if got := e.remoteRef("many", "refs/heads/main"); got != tip {
		t.Fatalf("main = %s, want %s", got, tip)
	}
	u.mustGit(e.repoDir("many"), "fsck", "--strict", "--no-dangling")
}

// BenchmarkPushManyObjects pushes a commit of 1,000,000 small files (the push
// that took a gitserver from 78 to 413 MB) with the real git over ssh to a
// gitserver in a process of its own, into a new app each iteration, and reports
// the gitserver's peak resident memory (VmHWM) beside its resident memory before
// the first push, the rise per pushed object, and, as the baseline, the peak of
// git index-pack indexing the same pack (what git's own receive-pack runs) and
// the pack's size.
func BenchmarkPushManyObjects(b *testing.B) {
	const n = 1_000_000
	e := newEnv(b)
	admin := e.addUser("many", appv1.RoleAdmin, false)
	dir := filepath.Join(b.TempDir(), "many")
	testenv.ManySmallFiles(b, dir, n)
	state := b.TempDir()
	addr, pid := childServer(b, e, state)

	// The baseline: the pack git sends, indexed by git index-pack.
	pack := filepath.Join(b.TempDir(), "push.pack")
	po := exec.Command("sh", "-c", "echo main | git pack-objects --stdout --revs --delta-base-offset -q > "+pack)
	po.Dir = dir
	if out, err := po.CombinedOutput(); err != nil {
		b.Fatalf("pack-objects: %v\n%s", err, out)
	}
	st, err := os.Stat(pack)
	if err != nil {
		b.Fatal(err)
	}
	ref := filepath.Join(b.TempDir(), "ref.git")
	admin.mustGit(b.TempDir(), "init", "-q", "--bare", ref)
	ip := exec.Command("git", "index-pack", "--strict", "-o", filepath.Join(b.TempDir(), "ref.idx"), pack)
	ip.Dir = ref
	if out, err := ip.CombinedOutput(); err != nil {
		b.Fatalf("index-pack: %v\n%s", err, out)
	}
	gitPeak := ip.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10

	idle := peakRSS(b, pid)
	var took time.Duration
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		admin.mustGit(dir, "push", "-q", fmt.Sprintf("ssh://git@%s/many-%d", addr, i), "main")
		took += time.Since(start)
	}
	peak := peakRSS(b, pid)
	objects := float64(n + n/1000 + 2) // the files, their directories, the root tree, the commit
	b.ReportMetric(float64(idle)/(1<<20), "gitserver-idle-MiB")
	b.ReportMetric(float64(peak)/(1<<20), "gitserver-peak-MiB")
	b.ReportMetric(float64(peak-idle)/objects, "gitserver-B/object")
	b.ReportMetric(float64(gitPeak)/(1<<20), "git-index-pack-peak-MiB")
	b.ReportMetric(float64(st.Size())/(1<<20), "pack-MiB")
	b.ReportMetric(took.Seconds()/float64(b.N), "push-s/op")
}
