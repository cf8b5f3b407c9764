package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cgroupMounts lists the mount points of the cgroup v1 hierarchies, and with v2
// the cgroup2 one too. This machine runs the hybrid layout: v1 controllers, and a
// cgroup2 at unified, where runc also puts each container.
func cgroupMounts(v2 bool) ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 3 && (fields[2] == "cgroup" || v2 && fields[2] == "cgroup2") {
			dirs = append(dirs, fields[1])
		}
	}
	return dirs, s.Err()
}

// createCgroups makes the kubelet's cgroup root in every hierarchy: the kubelet
// refuses a root that is missing in any of them. cpuset needs its cpus and mems
// copied from the parent before a task can join.
func (l *layout) createCgroups() error {
	dirs, err := cgroupMounts(false)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return errors.New("no cgroup v1 hierarchy is mounted under /sys/fs/cgroup: this node is written for cgroup v1 (hybrid) hosts")
	}
	for _, d := range dirs {
		for _, cg := range []string{l.cgroupRoot(), l.kubeletCgroupRoot(), l.nodeCgroup()} {
			dir := filepath.Join(d, cg)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// joinNodeCgroup moves the calling process into node/ in every hierarchy, before
// it starts anything: its children, and theirs, are born there.
func (l *layout) joinNodeCgroup() error {
	dirs, err := cgroupMounts(false)
	if err != nil {
		return err
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, l.nodeCgroup(), "cgroup.procs"), pid, 0o644); err != nil {
			return fmt.Errorf("join cgroup %s: %w", filepath.Join(d, l.nodeCgroup()), err)
		}
	}
	return nil
}

// tasks lists the PIDs in the cluster's cgroups (any hierarchy: a task is in
// every one).
func (l *layout) tasks() ([]int, error) {
	dirs, err := cgroupMounts(true)
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(d, l.cgroupRoot()), func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids, nil
}

// removeCgroups removes the cluster's cgroups, deepest first. It runs after every
// process of the node has ended; a cgroup that still holds a task is reported.
func (l *layout) removeCgroups() error {
	dirs, err := cgroupMounts(true)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		root := filepath.Join(d, l.cgroupRoot())
		var all []string
		_ = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, path)
			}
			return nil
		})
		slices.Reverse(all)
		for _, p := range all {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}
