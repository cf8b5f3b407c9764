package clusterapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"bex.co/bex/internal/ready"
)

// Run is how StartManager runs a manager.
type Run struct {
	Bin        string   // the manager's binary (bin/<Manager.Name>)
	Kubeconfig string   // the API server it works against
	CertDir    string   // its webhooks' serving certificate (WebhookServingCert)
	LogPath    string   // its stdout and stderr
	Release    string   // the version its log must name (CheckVersion)
	Env        []string // added to this process's environment
	// ReadyTimeout bounds the wait for its /readyz; default 2 minutes.
	ReadyTimeout time.Duration
}

// Process is a manager that StartManager started.
type Process struct {
	Manager Manager
	PID     int
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{} // closed once it has exited
}

// StartManager starts m as r says, in a process group of its own and with SIGKILL
// as its parent-death signal (it ends with this process), waits until its /readyz
// answers (which includes its webhook server) and checks that it is of r.Release.
// When it exits first, is not ready in time or is of another release, it is
// stopped and the error says so, with the end (or the start) of its log.
func StartManager(m Manager, r Run) (*Process, error) {
	if r.ReadyTimeout == 0 {
		r.ReadyTimeout = 2 * time.Minute
	}
	logFile, err := os.Create(r.LogPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(r.Bin, m.Args(r.Kubeconfig, r.CertDir)...)
	cmd.Env = append(os.Environ(), r.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", m.Name, err)
	}
	p := &Process{Manager: m, PID: cmd.Process.Pid, LogPath: r.LogPath, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.exited) }()

	ctx, cancel := context.WithTimeout(context.Background(), r.ReadyTimeout)
	defer cancel()
	err = ready.Wait(ctx, 50*time.Millisecond, p.exited, m.Ready)
	var nr *ready.Error
	switch {
	case errors.As(err, &nr) && nr.Exited:
		return nil, fmt.Errorf("%s exited before it was ready (%v); its log ends with:\n%s", m.Name, cmd.ProcessState, ready.LogTail(r.LogPath, 15))
	case nr != nil:
		p.Stop(10 * time.Second)
		return nil, fmt.Errorf("%s not ready after %s: %v; its log ends with:\n%s", m.Name, r.ReadyTimeout, nr.Last, ready.LogTail(r.LogPath, 15))
	case err != nil:
		p.Stop(10 * time.Second)
		return nil, err
	}
	if err := CheckVersion(m, r.LogPath, r.Release); err != nil {
		p.Stop(10 * time.Second)
		return nil, err
	}
	return p, nil
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM, then SIGKILL if the process has not exited within grace, and
// waits for it. It says whether it had to kill it.
func (p *Process) Stop(grace time.Duration) (killed bool) {
	select {
	case <-p.exited:
		return false
	default:
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	<-p.exited
	return true
}

// CheckVersion checks that the log of m, once ready, names release as its
// version: hack/tools.sh stamps the version into the binaries, and a tools module
// left at another release than CLUSTER_API_VERSION shows here.
func CheckVersion(m Manager, logPath, release string) error {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return err
	}
	if !bytes.Contains(data, []byte(`"Version: `+release+" ")) {
		return fmt.Errorf("%s does not say it is Cluster API %s (run make tools to build that release); its log begins with:\n%s", m.Name, release, logHead(data, 15))
	}
	return nil
}

func logHead(data []byte, n int) string {
	lines := strings.Split(string(data), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return "    " + strings.Join(lines, "\n    ")
}
