package e2e

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// diskFullSize is the size of the tmpfs the whole state dir lives on. bex up
// alone takes 125 MiB of it (123 MiB is etcd's: its WAL segment and the next one,
// each preallocated at 64 MiB), with one small busybox app 130 MiB; the other
// 125 MiB are what a push or a build can fill, the margin (5%, 12.8 MiB) included.
const diskFullSize = 256 << 20

// TestFullDiskIsAnErrorNotDamage: with the whole state dir on a small file system
// (a size-limited tmpfs: the kernel's own ENOSPC), a push whose pack fills it and a
// push whose build fills it are both refused with one line; after each the app's
// repository is valid (git fsck), its branch unmoved, the release that served still
// serves, and bex up runs on with the same processes (none died and was
// restarted); with the disk short of its margin a push is refused at once, and once
// space is freed the next push builds and serves.
func TestFullDiskIsAnErrorNotDamage(t *testing.T) {
	p := newPlatform(t)
	mountSmallFS(t, p.dir, diskFullSize)
	t.Cleanup(p.kill)
	p.start(t)
	used := func() (used, free uint64) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p.dir, &st); err != nil {
			t.Fatal(err)
		}
		return (st.Blocks - st.Bfree) * uint64(st.Bsize), st.Bavail * uint64(st.Bsize)
	}
	u, f := used()
	t.Logf("bex up alone uses %d MiB of the %d MiB state dir (%d MiB free)", u>>20, diskFullSize>>20, f>>20)

	app := p.newRepo(t, "hello-shell", "fills")
	if out, err := app.push(); err != nil {
		t.Fatalf("first push: %v\n%s", err, out)
	}
	first := strings.TrimSpace(app.git(t, "rev-parse", "HEAD"))
	testenv.Eventually(t, 30*time.Second, "the first release", p.answers("fills", "/", "hello from bex"))
	u, f = used()
	t.Logf("with one app: %d MiB used, %d MiB free", u>>20, f>>20)
	procs := longLived(p)
	// etcd runs with its space quota: 5% of 256 MiB is under the 64 MiB floor.
	if etcd := lines(strings.Join(procs, "\n"), "--data-dir "+filepath.Join(p.dir, "controlplane", "etcd")); len(etcd) != 1 ||
		!strings.Contains(etcd[0], "--quota-backend-bytes 67108864") {
		t.Errorf("etcd's command line lacks its quota: %q", etcd)
	}

	// unharmed is what must hold after each refusal.
	unharmed := func(t *testing.T, step string) {
		t.Helper()
		if got := app.remoteHead(t); got != first {
			t.Errorf("%s: main moved to %s, want %s", step, got, first)
		}
		bare := filepath.Join(p.dir, "repos", "fills.git")
		if out, err := exec.Command("git", "-C", bare, "fsck", "--full", "--strict").CombinedOutput(); err != nil {
			t.Errorf("%s: git fsck of %s: %v\n%s", step, bare, err, out)
		}
		testenv.Eventually(t, 10*time.Second, step+": the serving release answers", p.answers("fills", "/", "hello from bex"))
		if stdout, stderr, err := p.ssh(t, "apps"); err != nil || !strings.Contains(stdout, "fills") {
			t.Errorf("%s: ssh apps: %v\n%s%s", step, err, stdout, stderr)
		}
		if now := longLived(p); strings.Join(now, "\n") != strings.Join(procs, "\n") {
			t.Errorf("%s: bex up's processes changed (one died):\nbefore:\n%s\nafter:\n%s\n%s", step,
				strings.Join(procs, "\n"), strings.Join(now, "\n"), p.out)
		}
		if strings.Contains(p.out.String(), "exited; restarting") {
			t.Errorf("%s: a component of bex up died:\n%s", step, p.out)
		}
		u, f := used()
		t.Logf("%s: %d MiB used, %d MiB free", step, u>>20, f>>20)
	}

	t.Run("a pack that fills the disk", func(t *testing.T) {
		_, free := used()
		// Random bytes: git cannot compress them, so the pack is as large as the
		// file, more than is free.
		big := make([]byte, free+16<<20)
		_, _ = rand.Read(big)
		if err := os.WriteFile(filepath.Join(app.dir, "big.bin"), big, 0o644); err != nil {
			t.Fatal(err)
		}
		// Stored and sent uncompressed: zlib would take most of the test's time.
		app.git(t, "-c", "core.compression=0", "add", "big.bin")
		app.git(t, "commit", "-q", "-m", "too big for the disk")
		out, err := app.tryGit("-c", "pack.compression=0", "push", "bex", "main")
		t.Logf("push:\n%s", out)
		if want := "the disk of " + p.dir + " filled up, so nothing was stored: free space on it and push again"; err == nil || !strings.Contains(out, want) {
			t.Fatalf("a push that fills the disk: err %v, want %q:\n%s", err, want, out)
		}
		unharmed(t, "after the pack")
		app.git(t, "reset", "-q", "--hard", first)
	})

	// Two ways a build fills the disk: head writes in small chunks, dd 64 MiB per
	// write, five times the margin. The builder's watch stops either under the
	// margin (on this tmpfs each 64 MiB write takes longer than the watch's
	// 20 ms); a step that still meets the kernel's ENOSPC first gets the same line,
	// the watch having seen the disk under the margin.
	for _, run := range []string{"head -c 2000000000 /dev/zero > /fill", "dd if=/dev/zero of=/fill bs=64M count=30"} {
		t.Run("a build that fills the disk: "+strings.Fields(run)[0], func(t *testing.T) {
			commit := app.commit(t, "a build that fills the disk", map[string]string{"Dockerfile": "FROM busybox\nRUN " + run + "\n"})
			out, err := app.push()
			t.Logf("push:\n%s", out)
			if want := "the build filled the disk of " + p.dir + " ("; err == nil || !strings.Contains(out, want) {
				t.Errorf("a build that fills the disk: err %v, want %q:\n%s", err, want, out)
			}
			// The build's record says why it failed: the builder's log store had
			// room to write it.
			stdout, stderr, err := p.ssh(t, "builds", "fills", "--json")
			var builds []struct{ Commit, Result, Error string }
			if err == nil {
				err = json.Unmarshal([]byte(stdout), &builds)
			}
			if err != nil || len(builds) == 0 || builds[0].Commit != commit || builds[0].Result != "failed" ||
				!strings.HasPrefix(builds[0].Error, "the build filled the disk of ") {
				t.Errorf("builds fills --json: %v, want the latest to be %s, failed for the disk:\n%s%s", err, commit, stdout, stderr)
			}
			unharmed(t, "after the build")
			app.git(t, "reset", "-q", "--hard", first)
		})
	}

	t.Run("freeing space lets the next push through", func(t *testing.T) {
		// Under the margin (5% of the file system), a push is refused at once.
		_, free := used()
		filler := filepath.Join(p.dir, "filler")
		if err := os.WriteFile(filler, make([]byte, free-8<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		second := app.commit(t, "a small change", map[string]string{"index.txt": "v2\n"})
		out, err := app.push()
		if err == nil || !strings.Contains(out, "MiB free (under the 12 MiB bex keeps): free space on it and push again") {
			t.Fatalf("a push under the margin: err %v:\n%s", err, out)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if out, err := app.push(); err != nil {
			t.Fatalf("a push after freeing space: %v\n%s", err, out)
		}
		if got := app.remoteHead(t); got != second {
			t.Fatalf("main = %s after the push, want %s", got, second)
		}
		testenv.Eventually(t, 30*time.Second, "the new release", p.answers("fills", "/", "hello from bex"))
	})
	p.stop(t)
}

// mountSmallFS mounts a tmpfs of size bytes on dir (root only, 0700 as a state dir
// is) and unmounts it when the test ends, after bex up (registered later) stops.
func mountSmallFS(t *testing.T, dir string, size int) {
	t.Helper()
	opts := fmt.Sprintf("size=%d,mode=0700", size)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a tmpfs on the state dir (the test needs root): %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
}

// longLived lists bex up's own processes (the daemons and components, by pid and
// command line), not the apps' or the builds'.
func longLived(p *platform) []string {
	var out []string
	for _, proc := range processesMentioning(p.dir) {
		if strings.Contains(proc, "containerd-shim") {
			continue
		}
		out = append(out, proc)
	}
	sort.Strings(out)
	return out
}
