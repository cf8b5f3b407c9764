package gitserver_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// bigHistory writes, with git fast-import, a repository of commits commits on main
// holding about totalBytes of incompressible file content, in one new file per
// commit plus one file edited by every commit (so later pushes can send deltas).
func bigHistory(t testing.TB, dir string, commits, totalBytes int) {
	t.Helper()
	testenv.FastImport(t, dir, func(w *bufio.Writer) {
		rng := rand.New(rand.NewPCG(1, 2))
		per := totalBytes / commits
		blob := make([]byte, per)
		log := strings.Repeat("a line that every version of the log shares\n", 200)
		for i := 1; i <= commits; i++ {
			for j := range blob {
				blob[j] = byte(rng.Uint32())
			}
			log += fmt.Sprintf("commit %d\n", i)
			fmt.Fprintf(w, "commit refs/heads/main\ncommitter bex <test@bex.co> %d +0000\ndata <<EOT\ncommit %d\nEOT\n", 1700000000+i, i)
			fmt.Fprintf(w, "M 644 inline data/%04d.bin\ndata %d\n", i, len(blob))
			w.Write(blob)
			fmt.Fprintf(w, "\nM 644 inline log.txt\ndata %d\n%s\n", len(log), log)
		}
	})
	cmd := exec.Command("git", "checkout", "-q", "main")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("checkout: %v\n%s", err, out)
	}
}

func TestLargePushThenThinIncrementalPush(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := filepath.Join(t.TempDir(), "big")
	bigHistory(t, dir, 2000, 50<<20)
	admin.mustGit(dir, "remote", "add", "bex", e.url("big"))
	admin.mustGit(dir, "push", "-q", "bex", "main")

	// One commit on top: git sends a thin pack whose log.txt is a delta against the
	// version the server has.
	log := admin.mustGit(dir, "show", "HEAD:log.txt")
	tip := admin.commit(dir, "log.txt", log+"one more line\n")
	admin.mustGit(dir, "push", "-q", "bex", "main")
	if got := e.remoteRef("big", "refs/heads/main"); got != tip {
		t.Fatalf("main = %s, want %s", got, tip)
	}
	if !strings.Contains(e.logs.String(), "completed=1") {
		t.Errorf("the incremental push was not a thin pack completed from the repository; server log:\n%s", lastLines(e.logs.String(), 5))
	}
	clone := filepath.Join(t.TempDir(), "clone")
	admin.mustGit(t.TempDir(), "clone", "-q", e.url("big"), clone)
	admin.mustGit(clone, "fsck", "--strict", "--no-dangling")
	admin.mustGit(e.repoDir("big"), "fsck", "--strict", "--no-dangling")
	if n := strings.TrimSpace(admin.mustGit(clone, "rev-list", "--count", "HEAD")); n != "2001" {
		t.Fatalf("clone has %s commits, want 2001", n)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
