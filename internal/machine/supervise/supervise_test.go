package supervise

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

func init() {
	MinBackoff, MaxBackoff = 20*time.Millisecond, 100*time.Millisecond
}

// shell is a child running script under /bin/sh.
func shell(t *testing.T, name, script string) Process {
	return Process{Name: name, Path: "/bin/sh", Args: []string{"-c", script}, LogPath: filepath.Join(t.TempDir(), name+".log"), Grace: 2 * time.Second}
}

// fileExists is a readiness check: the child creates path when it is ready.
func fileExists(path string) func(context.Context) error {
	return func(context.Context) error {
		_, err := os.Stat(path)
		return err
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// started checks that the child has started n times (a line each in the file).
func started(starts func() []string, n int) func() error {
	return func() error {
		if got := starts(); len(got) != n {
			return fmt.Errorf("started %d times: %v", len(got), got)
		}
		return nil
	}
}

// running checks that pid is a live process.
func running(pid func() int) func() error {
	return func() error {
		if p := pid(); !alive(p) {
			return fmt.Errorf("pid %d is not running", p)
		}
		return nil
	}
}

func TestStartWaitsForReadiness(t *testing.T) {
	s := New(nil)
	defer s.Stop()
	ready := filepath.Join(t.TempDir(), "ready")
	p := shell(t, "slow", fmt.Sprintf("sleep 0.3; touch %s; exec sleep 60", ready))
	p.Ready = fileExists(ready)
	start := time.Now()
	pid, err := s.Start(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatalf("Start returned after %s, before the child was ready", time.Since(start))
	}
	if !alive(pid) {
		t.Fatalf("pid %d not running", pid)
	}
}

func TestStartFailureSaysWhy(t *testing.T) {
	s := New(nil)
	defer s.Stop()
	p := shell(t, "broken", "echo 'cannot bind :80: permission denied' >&2; exit 3")
	p.Ready = func(context.Context) error { return errors.New("not listening") }
	_, err := s.Start(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "broken exited before it was ready") || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("err = %v", err)
	}

	p = shell(t, "never", "exec sleep 60")
	p.Ready = func(context.Context) error { return errors.New("no socket yet") }
	p.ReadyTimeout = 200 * time.Millisecond
	_, err = s.Start(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "not ready after 200ms: no socket yet") {
		t.Fatalf("err = %v", err)
	}
}

func TestRestartsWhatDies(t *testing.T) {
	s := New(nil)
	defer s.Stop()
	dir := t.TempDir()
	count := filepath.Join(dir, "starts")
	// Each start appends a line, then runs until killed.
	p := shell(t, "worker", fmt.Sprintf("echo $$ >> %s; exec sleep 60", count))
	pid, err := s.Start(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	starts := func() []string {
		data, _ := os.ReadFile(count)
		return strings.Fields(string(data))
	}
	for i := 2; i <= 3; i++ {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("start %d", i-1), started(starts, i-1))
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("start %d", i), started(starts, i))
		fmt.Sscan(starts()[i-1], &pid)
		testenv.Eventually(t, 10*time.Second, "the new child", running(func() int { return pid }))
	}
}

func TestStopsInReverseOrder(t *testing.T) {
	s := New(nil)
	var mu sync.Mutex
	var order []string
	var pids []int
	for _, name := range []string{"first", "second", "third"} {
		p := shell(t, name, "exec sleep 60")
		p.AfterStop = func() { mu.Lock(); order = append(order, name); mu.Unlock() }
		pid, err := s.Start(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "third,second,first" {
		t.Fatalf("stopped %s", got)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d still running", pid)
		}
	}
	if _, err := s.Start(context.Background(), shell(t, "late", "exec sleep 60")); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
}

func TestStopKillsWhatIgnoresSIGTERM(t *testing.T) {
	s := New(nil)
	ready := filepath.Join(t.TempDir(), "trapped")
	p := shell(t, "stubborn", fmt.Sprintf("trap '' TERM; touch %s; while :; do sleep 0.05; done", ready))
	p.Ready = fileExists(ready)
	p.Grace = 200 * time.Millisecond
	pid, err := s.Start(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Stop()
	if err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Fatalf("Stop: %v", err)
	}
	if alive(pid) {
		t.Fatalf("pid %d survived", pid)
	}
}

func oomScoreAdj(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// canLowerOOMScore reports whether this process has CAP_SYS_RESOURCE (bit 24 of
// CapEff), which lowering an oom_score_adj needs.
func canLowerOOMScore(t *testing.T) bool {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var caps uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(hex), "%x", &caps); err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

// A child gets its oom_score_adj on the first start and on every restart; one
// that asks for nothing gets 0, not the supervisor's own. A value below the
// supervisor's, where the kernel refuses it (no CAP_SYS_RESOURCE), leaves the
// child with the supervisor's and does not fail the start.
func TestOOMScoreAdjOnEveryStart(t *testing.T) {
	s := New(nil)
	defer s.Stop()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	// The first child exits when told to: its restart must get the value too.
	p := shell(t, "tenant-like", fmt.Sprintf(`touch %[2]s
if [ ! -e %[1]s/once ]; then touch %[1]s/once; while [ ! -e %[1]s/exit ]; do sleep 0.01; done; exit 1; fi
exec sleep 60`, dir, ready))
	p.Ready, p.OOMScoreAdj = fileExists(ready), 321
	pid, err := s.Start(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if got := oomScoreAdj(t, pid); got != "321" {
		t.Fatalf("child: oom_score_adj %s, want 321", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "exit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	current := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.children[0].pid()
	}
	testenv.Eventually(t, 10*time.Second, "the restarted child", func() error {
		if current() == pid {
			return fmt.Errorf("still pid %d", pid)
		}
		return running(current)()
	})
	if got := oomScoreAdj(t, current()); got != "321" {
		t.Fatalf("restarted child: oom_score_adj %s, want 321", got)
	}

	self := oomScoreAdj(t, os.Getpid())
	defer func() { _ = os.WriteFile("/proc/self/oom_score_adj", []byte(self), 0) }()
	// The supervisor raises its own (always allowed): an ordinary child is still 0.
	if err := SetOOMScoreAdj(0, 100); err != nil {
		t.Fatal(err)
	}
	plain := shell(t, "plain", "exec sleep 60")
	if pid, err = s.Start(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	if got := oomScoreAdj(t, pid); got != "0" {
		t.Fatalf("child without OOMScoreAdj: oom_score_adj %s, want 0", got)
	}

	protected := shell(t, "protected", "exec sleep 60")
	protected.OOMScoreAdj = -567
	if pid, err = s.Start(context.Background(), protected); err != nil {
		t.Fatal(err)
	}
	want := "-567"
	if !canLowerOOMScore(t) {
		want = "100" // the supervisor's, inherited
	}
	if got := oomScoreAdj(t, pid); got != want {
		t.Fatalf("protected child (CAP_SYS_RESOURCE: %v): oom_score_adj %s, want %s", canLowerOOMScore(t), got, want)
	}
	if err := SetOOMScoreAdj(0, 2000); err == nil {
		t.Fatal("SetOOMScoreAdj accepted 2000")
	}
}
