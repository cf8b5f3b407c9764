package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestPauseReapsZombies runs the pause program as PID 1 of a PID namespace of its
// own, as in a pod that shares its PID namespace, leaves it an orphan, ends the
// orphan and checks that pause reaps it, then that SIGTERM ends pause with 0.
func TestPauseReapsZombies(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	nsenter, err := testenv.Binary("nsenter")
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := testenv.Binary("busybox")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", bin, "./hack/nodeimages/pause")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}

	pause := exec.Command(bin)
	var out testenv.SyncBuffer
	pause.Stdout, pause.Stderr = &out, &out
	pause.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	if err := pause.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pause.Wait() }()
	t.Cleanup(func() {
		_ = pause.Process.Kill()
		<-done
	})
	testenv.Eventually(t, 10*time.Second, "pause says it waits", func() error {
		if !strings.Contains(out.String(), "pause: waiting") {
			return fmt.Errorf("it printed %q", out.String())
		}
		return nil
	})

	// A shell in pause's namespace starts a sleep in the background and exits:
	// the sleep's parent becomes pause.
	orphanMaker := exec.Command(nsenter, "-t", strconv.Itoa(pause.Process.Pid), "-p", "--",
		busybox, "sh", "-c", busybox+" sleep 600 </dev/null >/dev/null 2>&1 & exit 0")
	if msg, err := orphanMaker.CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, msg)
	}
	var orphan int
	testenv.Eventually(t, 10*time.Second, "the sleep is pause's child", func() error {
		kids := children(pause.Process.Pid)
		if len(kids) != 1 {
			return fmt.Errorf("pause's children: %v", kids)
		}
		orphan = kids[0]
		return nil
	})
	if err := syscall.Kill(orphan, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Unreaped, it would stay in /proc as a zombie (state Z).
	testenv.Eventually(t, 10*time.Second, "pause reaps the ended orphan", func() error {
		if st := procState(orphan); st != "" {
			return fmt.Errorf("process %d is still there, state %s", orphan, st)
		}
		return nil
	})

	if err := pause.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("pause on SIGTERM: %v; it printed %q", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pause still runs 10 s after SIGTERM")
	}
}

// children are the PIDs whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(p) == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

func ppid(pid int) int {
	v, _ := strconv.Atoi(procField(pid, "PPid:"))
	return v
}

// procState is the State: of pid's /proc/PID/status, "" when there is none.
func procState(pid int) string { return procField(pid, "State:") }

func procField(pid int, field string) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
