package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// down stops the cluster of DIR and checks that nothing of it is left: no process
// in its cgroups, no mount under DIR, no network namespace or veth. DIR's files
// stay (etcd's data, the repositories' volume, the logs): up in the same DIR
// brings the same cluster back.
func down(l *layout) error {
	if pid := l.nodePID(); pid != 0 {
		say("stopping the node (PID %d)", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !waitGone(pid, 2*time.Minute) {
			say("the node did not stop in 2 minutes: killing it")
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 10*time.Second)
		}
	}
	// Whatever is left in the cluster's cgroups (a node killed before it could
	// clean up leaves shims and containers, reparented to init) ends here.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := l.tasks()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v are still in the cluster's cgroups %s after SIGKILL", pids, l.cgroupRoot())
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond) // the kernel reaps them
	}
	var errs []error
	if err := l.deleteNetwork(); err != nil {
		errs = append(errs, err)
	}
	if err := l.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	_ = os.Remove(l.nodePIDFile())
	_ = os.Remove(l.path("node.ready"))
	_ = os.Remove(l.envFile())
	// The pods' addresses are given again by the next up.
	_ = os.RemoveAll(l.path("cni", "ipam"))
	if m := l.mountsUnder(); len(m) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %s", l.dir, strings.Join(m, ", ")))
	}
	if linkExists(l.hostVeth()) {
		errs = append(errs, fmt.Errorf("the veth %s is still there", l.hostVeth()))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	say("cluster in %s stopped; nothing of it is running", l.dir)
	return nil
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		time.Sleep(100 * time.Millisecond) // no pidfd for a process that is not our child
	}
	return syscall.Kill(pid, 0) != nil
}

// mountsUnder lists the host's mounts under DIR.
func (l *layout) mountsUnder() []string {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer f.Close()
	var found []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 1 && (fields[1] == l.dir || strings.HasPrefix(fields[1], l.dir+"/")) {
			found = append(found, fields[1])
		}
	}
	return found
}
