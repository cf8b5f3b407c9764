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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
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
		waitFor(t, fmt.Sprintf("start %d", i-1), func() bool { return len(starts()) == i-1 })
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("start %d", i), func() bool { return len(starts()) == i })
		fmt.Sscan(starts()[i-1], &pid)
		waitFor(t, "the new child", func() bool { return alive(pid) })
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
