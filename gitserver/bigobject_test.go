package gitserver_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// peakRSS is VmHWM of process pid, in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// childServer runs the gitserver in a process of its own (this test binary again,
// see runChildServer), so that its memory can be measured alone.
func childServer(t testing.TB, e *env, state string) (addr string, pid int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	return addr, startChildServer(t, e, state, addr).Process.Pid
}

// startChildServer starts this test binary as a gitserver on addr with its state
// in state (runChildServer; extraEnv adds to what it is told), killed when the
// test ends, and returns once it accepts connections.
func startChildServer(t testing.TB, e *env, state, addr string, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "BEX_TEST_KUBECONFIG="+e.cp.Kubeconfig,
		"BEX_TEST_NAMESPACE="+e.ns, "BEX_TEST_STATE="+state, "BEX_TEST_ADDR="+addr)
	cmd.Env = append(cmd.Env, extraEnv...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "child.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	e.eventually(func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	return cmd
}

func TestAGigabyteOfZerosIsRefusedWithTheLimitAndBoundedMemory(t *testing.T) {
	e := newEnv(t)
	u := e.addUser("big", appv1.RoleMember, true)
	state := t.TempDir()
	addr, pid := childServer(t, e, state)
	dir := u.workdir("zeros")
	u.mustGit(dir, "remote", "set-url", "bex", "ssh://git@"+addr+"/zeros")
	u.mustGit(dir, "push", "-q", "bex", "main")
	first := refAt(t, filepath.Join(state, "repos", "zeros.git"), "refs/heads/main")

	// git compresses the gigabyte of zeros to about a megabyte.
	hash := exec.Command("sh", "-c", "head -c 1G /dev/zero | git hash-object -w --stdin")
	hash.Dir = dir
	out, err := hash.Output()
	if err != nil {
		t.Fatal(err)
	}
	blob := strings.TrimSpace(string(out))
	u.mustGit(dir, "update-index", "--add", "--cacheinfo", "100644,"+blob+",assets/big.bin")
	u.mustGit(dir, "commit", "-q", "-m", "a gigabyte of zeros")

	before := peakRSS(t, pid)
	res, err := u.git(dir, "push", "bex", "main")
	if err == nil {
		t.Fatalf("push accepted:\n%s", res)
	}
	t.Logf("git push:\n%s", res)
	line := "assets/big.bin is 1.0 GiB, more than the limit of 100 MiB per file"
	if !strings.Contains(res, "! [remote rejected] main -> main ("+line+")") {
		t.Fatalf("want %q, got:\n%s", line, res)
	}
	peak := peakRSS(t, pid)
	t.Logf("gitserver VmHWM: %d MiB before the push, %d MiB after", before>>20, peak>>20)
	if peak > 512<<20 {
		t.Fatalf("the gitserver's peak RSS reached %d MiB", peak>>20)
	}
	if got := refAt(t, filepath.Join(state, "repos", "zeros.git"), "refs/heads/main"); got != first {
		t.Fatalf("main moved to %s", got)
	}
}

// TestLargeFilesUnderTheLimitKeepTheMemoryBounded: a chain of deltas on a 90 MiB
// file (each commit edits a few bytes of it) is resolved holding a base and a
// result at a time; the gitserver stays under 512 MiB.
func TestLargeFilesUnderTheLimitKeepTheMemoryBounded(t *testing.T) {
	e := newEnv(t)
	u := e.addUser("large", appv1.RoleMember, true)
	state := t.TempDir()
	addr, pid := childServer(t, e, state)
	dir := u.workdir("large")
	u.mustGit(dir, "remote", "set-url", "bex", "ssh://git@"+addr+"/large")
	big := filepath.Join(dir, "big.bin")
	gen := exec.Command("sh", "-c", "head -c 90M /dev/urandom > "+big)
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	u.mustGit(dir, "add", "big.bin")
	u.mustGit(dir, "commit", "-q", "-m", "90 MiB")
	for i := range 3 {
		f, err := os.OpenFile(big, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(fmt.Sprintf("edit %d", i)), int64(i+1)<<24); err != nil {
			t.Fatal(err)
		}
		f.Close()
		u.mustGit(dir, "commit", "-q", "-am", fmt.Sprintf("edit %d", i))
	}
	tip := strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
	u.mustGit(dir, "push", "-q", "bex", "main")
	peak := peakRSS(t, pid)
	t.Logf("gitserver VmHWM after pushing four versions of a 90 MiB file: %d MiB", peak>>20)
	if peak > 512<<20 {
		t.Fatalf("the gitserver's peak RSS reached %d MiB", peak>>20)
	}
	repo := filepath.Join(state, "repos", "large.git")
	if got := refAt(t, repo, "refs/heads/main"); got != tip {
		t.Fatalf("main = %s, want %s", got, tip)
	}
	u.mustGit(repo, "fsck", "--strict", "--no-dangling")
}
