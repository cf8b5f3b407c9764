package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Bounds of down: serve's own stop (managers, then the control plane) within
// stopGrace, and the end of its children (SIGKILL by their parent-death signal)
// within leftoverWait.
const (
	stopGrace    = 60 * time.Second
	leftoverWait = 10 * time.Second
)

// down stops the management plane of DIR and checks that no process of it is left.
// Without a running serve there is nothing to stop, and it says so.
func down(l layout) error {
	if _, err := os.Stat(l.mgmt()); os.IsNotExist(err) {
		say("no management plane in %s: nothing to do", l.dir)
		return nil
	}
	if pid := l.servePID(); pid != 0 {
		say("stopping the management plane of %s (PID %d)", l.dir, pid)
		if err := stopServe(l, pid); err != nil {
			return err
		}
	} else {
		say("the management plane of %s does not run", l.dir)
	}
	// A serve that was killed left its files.
	_ = os.Remove(l.readyFile())
	_ = os.Remove(l.pidFile())
	if left := leftovers(l); len(left) > 0 {
		var pids []string
		for _, p := range left {
			pids = append(pids, fmt.Sprint(p.pid))
		}
		for _, p := range left {
			fmt.Fprintf(os.Stderr, "    %s\n", p)
		}
		return fmt.Errorf("%d processes of %s are left (listed above): kill %s", len(left), l.mgmt(), strings.Join(pids, " "))
	}
	say("the management plane of %s is down", l.dir)
	return nil
}

// stopServe sends SIGTERM to the serve process pid and waits for it to end;
// SIGKILL after stopGrace.
func stopServe(l layout, pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("signal PID %d: %w", pid, err)
	}
	if waitGone(func() bool { return l.isServe(pid) }, stopGrace) {
		return nil
	}
	say("PID %d has not stopped in %s: killing it", pid, stopGrace)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("kill PID %d: %w", pid, err)
	}
	if !waitGone(func() bool { return l.isServe(pid) }, 10*time.Second) {
		return fmt.Errorf("PID %d (capdmgmt serve %s) survived SIGKILL: look at its state in /proc/%d/status", pid, l.dir, pid)
	}
	return nil
}

// leftovers are the processes that name a file of DIR/mgmt (etcd, kube-apiserver,
// the managers, a serve), once those on their way out have had leftoverWait.
func leftovers(l layout) []proc {
	var left []proc
	waitGone(func() bool {
		left = processes(func(args []string) bool {
			return mentions(args, l.mgmt()) || (isServe(args) && args[2] == l.dir)
		})
		return len(left) > 0
	}, leftoverWait)
	return left
}

// waitGone polls alive until it is false (true) or d has passed (false).
func waitGone(alive func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
