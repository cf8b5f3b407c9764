package gitserver_test

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// BenchmarkReceive pushes the same history to bex (over ssh, into a new app: no
// build, the fake builder answers at once) and to C git's own receive-pack (git push
// to a file:// bare repository), in the same iteration, and reports both and their
// ratio. "full" is 2,000 commits and 50 MB; "incremental" is one commit on top, a
// thin pack. The goal is bex/git <= 1.25. Git's side runs without
// receive.fsckObjects (its default) while bex always checks; the indexer alone
// against git index-pack --strict is receive's BenchmarkIndexBigHistory.
func BenchmarkReceive(b *testing.B) {
	e := newEnv(b)
	admin := e.addUser("bench", appv1.RoleAdmin, false)
	dir := filepath.Join(b.TempDir(), "big")
	bigHistory(b, dir, 2000, 50<<20)
	bare := func() string {
		p := filepath.Join(b.TempDir(), "ref.git")
		if out, err := exec.Command("git", "init", "-q", "--bare", p).CombinedOutput(); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		return p
	}
	timed := func(args ...string) time.Duration {
		start := time.Now()
		admin.mustGit(dir, args...)
		return time.Since(start)
	}
	report := func(b *testing.B, bex, git time.Duration) {
		n := float64(b.N)
		b.ReportMetric(bex.Seconds()/n, "bex-s/op")
		b.ReportMetric(git.Seconds()/n, "git-s/op")
		b.ReportMetric(float64(bex)/float64(git), "bex/git")
	}

	b.Run("full", func(b *testing.B) {
		var bex, git time.Duration
		i := 0
		for b.Loop() {
			i++
			bex += timed("push", "-q", e.url(fmt.Sprintf("full-%d", i)), "main")
			git += timed("push", "-q", "file://"+bare(), "main")
		}
		report(b, bex, git)
	})

	b.Run("incremental", func(b *testing.B) {
		app := e.url("incremental")
		ref := "file://" + bare()
		admin.mustGit(dir, "push", "-q", app, "main")
		admin.mustGit(dir, "push", "-q", ref, "main")
		var bex, git time.Duration
		i := 0
		for b.Loop() {
			i++
			log := admin.mustGit(dir, "show", "HEAD:log.txt")
			admin.commit(dir, "log.txt", fmt.Sprintf("%sincremental %d\n", log, i))
			bex += timed("push", "-q", app, "main")
			git += timed("push", "-q", ref, "main")
		}
		report(b, bex, git)
	})
}

// BenchmarkSSHRoundTrip is the floor under every push: ssh connects, authenticates
// and runs a command that the server refuses at once.
func BenchmarkSSHRoundTrip(b *testing.B) {
	e := newEnv(b)
	admin := e.addUser("bench", appv1.RoleAdmin, false)
	host, port, _ := net.SplitHostPort(e.addr)
	for b.Loop() {
		cmd := exec.Command("ssh", "-F", "/dev/null", "-p", port, "-i", admin.keyPath, "-o", "IdentitiesOnly=yes",
			"-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null",
			"-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR", "git@"+host, "true")
		_ = cmd.Run() // "unknown command": exit status 1 is the expected answer
	}
}
