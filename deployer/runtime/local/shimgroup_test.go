package local

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// The next release's instance starts in the shim of the one it replaces (one
// shim per app), and that shim keeps serving it once the instance that
// started the shim is gone: it answers, and when its process is killed the
// runtime starts it again.
func TestAnAppsInstancesShareOneShim(t *testing.T) {
	f := newFixture(t, uniqueName("shim"))
	f.deployV1()
	first := f.taskPid("web")
	shim := parentOf(t, first)

	d2 := f.desired(2, f.v2, 1)
	f.syncUntil(d2, time.Minute, "release 2 serves alone", func(st runtime.Status) bool {
		return rolledOut(st) && st.Serving == 2 && f.containersAre(1)() == nil
	})
	second := f.taskPid("web")
	if got := parentOf(t, second); got != shim {
		t.Fatalf("release 2's instance runs under pid %d, release 1's under the shim %d: not one shim per app", got, shim)
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints: %v", eps)
	}
	f.mustGet(eps[0], "version v2")

	// The shim's first container is gone: its last one still restarts in it.
	if err := syscall.Kill(int(second), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the instance started again", func() error {
		pid, err := f.runningPid("web")
		if err != nil {
			return err
		}
		if pid == second {
			return fmt.Errorf("still pid %d", pid)
		}
		// In the app's shim, or, when the restart came as the shim emptied
		// (release 1's instance stopping then), in the next one.
		return nil
	})
	f.syncUntil(d2, time.Minute, "release 2 serves again", func(st runtime.Status) bool {
		return rolledOut(st) && len(f.endpoints()) == 1
	})
	f.mustGet(f.endpoints()[0], "version v2")
}

// runningPid is taskPid for a check that is tried again: an error while no
// instance of process runs.
func (f *fixture) runningPid(process string) (uint32, error) {
	f.rt.mu.Lock()
	var inst *instance
	for _, i := range f.rt.apps[f.key()].instances {
		if i.process == process && i.running && !i.leaving() {
			inst = i
		}
	}
	f.rt.mu.Unlock()
	if inst == nil {
		return 0, fmt.Errorf("no running %s instance", process)
	}
	task, err := inst.ctr.Task(f.rt.ctx, nil)
	if err != nil {
		return 0, err
	}
	return task.Pid(), nil
}

// parentOf is pid's parent's pid (the shim, for a container's first process).
func parentOf(t *testing.T, pid uint32) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...: comm may hold spaces, so after the last ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	var ppid int
	if _, err := fmt.Sscan(fields[1], &ppid); err != nil {
		t.Fatal(err)
	}
	return ppid
}
