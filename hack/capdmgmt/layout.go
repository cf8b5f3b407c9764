package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// layout names the files of one management plane, all under DIR/mgmt.
type layout struct{ dir string }

func (l layout) mgmt() string               { return filepath.Join(l.dir, "mgmt") }
func (l layout) path(name string) string    { return filepath.Join(l.mgmt(), name) }
func (l layout) pidFile() string            { return l.path("pid") }
func (l layout) readyFile() string          { return l.path("ready") }
func (l layout) kubeconfig() string         { return l.path("kubeconfig") }
func (l layout) logs() string               { return l.path("logs") }
func (l layout) logFile(name string) string { return filepath.Join(l.logs(), name+".log") }

// isReady: the serve process has said that every part serves.
func (l layout) isReady() bool {
	_, err := os.Stat(l.readyFile())
	return err == nil
}

// servePID is the PID that DIR/mgmt/pid names when that process is `capdmgmt
// serve DIR`, else 0: a PID file left by a process that died may name another
// process since.
func (l layout) servePID() int {
	b, err := os.ReadFile(l.pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !l.isServe(pid) {
		return 0
	}
	return pid
}

// isServe: process pid is `capdmgmt serve DIR` (a zombie's command line is empty:
// it is no longer).
func (l layout) isServe(pid int) bool {
	args := cmdline(pid)
	return isServe(args) && args[2] == l.dir
}

// removePIDFile removes the pid file if it names pid.
func (l layout) removePIDFile(pid int) {
	b, err := os.ReadFile(l.pidFile())
	if err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(pid) {
		_ = os.Remove(l.pidFile())
	}
}
