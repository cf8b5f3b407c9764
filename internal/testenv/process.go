package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"bex.co/bex/internal/ready"
)

// process is a daemon started by the harness, its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // the exit error, once done is closed
}

// startProcess starts bin with args, its stdout and stderr going to dir/name.log.
// The daemon gets SIGKILL if the test binary dies first, so a crashed test leaves
// no daemon behind.
func startProcess(dir, name, bin string, args []string, env ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls check until it succeeds, the process exits or timeout passes. The
// error carries the end of the daemon's log, which is where the cause is.
func (p *process) waitReady(timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := ready.Wait(ctx, 20*time.Millisecond, p.done, check)
	var nr *ready.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nr) && nr.Exited:
		return fmt.Errorf("%s exited before it was ready (%v); its log ends with:\n%s", p.name, p.err, p.logTail(20))
	case nr != nil:
		return fmt.Errorf("%s not ready after %s: %v; its log ends with:\n%s", p.name, timeout, nr.Last, p.logTail(20))
	}
	return err
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
// server is a process that serves on TCP addresses (nginx, Caddy, a Helper), and
// what the benchmarks read of it.
type server struct {
	proc  *process
	grace time.Duration // how long Stop waits after SIGTERM
}

// startServer starts bin as startProcess does, and waits up to timeout until
// every address in listen accepts connections.
func startServer(dir, name, bin string, args, env []string, grace, timeout time.Duration, listen []string) (server, error) {
	proc, err := startProcess(dir, name, bin, args, env...)
	if err != nil {
		return server{}, err
	}
	s := server{proc: proc, grace: grace}
	if err := proc.waitListening(timeout, listen...); err != nil {
		_ = s.Stop()
		return server{}, err
	}
	return s, nil
}

// CPUTime is the CPU time the server has used (user and system, all threads),
// from /proc; 0 once it has exited.
func (s server) CPUTime() time.Duration { return processCPUTime(s.proc.cmd.Process.Pid) }

// Stop sends SIGTERM, then SIGKILL after the server's grace period.
func (s server) Stop() error { return s.proc.stop(s.grace) }

// waitListening waits until every address in listen accepts TCP connections.
func (p *process) waitListening(timeout time.Duration, listen ...string) error {
	return p.waitReady(timeout, ready.TCP(listen...))
}

func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s ignored SIGTERM for %s and was killed", p.name, grace)
}

func (p *process) logTail(n int) string { return ready.LogTail(p.logPath, n) }

// removeAll unmounts whatever is still mounted below dir (overlay snapshots of a
// container that outlived its test), then removes dir.
func removeAll(dir string) error {
	var mounts []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
				mounts = append(mounts, fields[4])
			}
		}
		f.Close()
	}
	// Deepest first, so that nested mounts go before their parents.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
