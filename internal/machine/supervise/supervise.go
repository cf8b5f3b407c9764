package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"bex.co/bex/internal/ready"
)

// Process describes one child.
type Process struct {
	// Name names the child in logs and messages ("containerd").
	Name string
	// Path and Args are the program and its arguments (without argv[0]).
	Path string
	Args []string
	// Env is added to the supervisor's environment.
	Env []string
	// KeepEnv, when set, chooses which of the supervisor's variables ("NAME=value")
	// the child inherits; nil passes them all.
	KeepEnv func(string) bool
	// Dir is the working directory; empty means the supervisor's.
	Dir string
	// LogPath receives the child's stdout and stderr, appended across restarts.
	LogPath string
	// Ready reports whether the child serves. Start polls it until it returns nil.
	// Nil means ready once started.
	Ready func(ctx context.Context) error
	// ReadyTimeout bounds the wait for Ready on each start. Default 60s.
	ReadyTimeout time.Duration
	// Grace is how long Stop waits after SIGTERM before SIGKILL. Default 10s.
	Grace time.Duration
	// OOMScoreAdj is written to the child's /proc/PID/oom_score_adj on every start
	// (-1000..1000; lower is killed later by the kernel when memory runs out). The
	// child inherits the supervisor's own until then, so a supervisor that protects
	// itself leaves no window in which a protected child is not. 0 is an ordinary
	// process's value, whatever the supervisor's.
	OOMScoreAdj int
	// AfterStop, when set, runs after the child has stopped for good (Stop), to
	// clean up what it leaves behind (a daemon's own children, sockets).
	AfterStop func()
}

// Backoff bounds of restarts. A child that ran for ResetAfter is considered healthy
// again and its next restart waits MinBackoff.
var (
	MinBackoff = 500 * time.Millisecond
	MaxBackoff = 30 * time.Second
	ResetAfter = time.Minute
)

// Supervisor owns the children started through it.
type Supervisor struct {
	log *slog.Logger

	mu       sync.Mutex
	children []*child
	stopping bool

	oomWarning sync.Once // the missing CAP_SYS_RESOURCE is said once
}

// New returns a supervisor logging to log.
func New(log *slog.Logger) *Supervisor {
	if log == nil {
		log = slog.Default()
	}
	return &Supervisor{log: log}
}

type child struct {
	p          Process
	log        *slog.Logger
	oomWarning *sync.Once

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current cmd has exited
	stop    chan struct{} // closed by Stop: no more restarts
	stopped chan struct{} // closed when the restart loop has ended
}

// Start starts p, waits until it is ready, and keeps it running until Stop: when it
// exits it is started again after a backoff. It returns the child's PID. When the
// first start fails or the child is not ready in time, Start stops it and returns an
// error that ends with the child's log.
func (s *Supervisor) Start(ctx context.Context, p Process) (int, error) {
	if p.ReadyTimeout == 0 {
		p.ReadyTimeout = 60 * time.Second
	}
	if p.Grace == 0 {
		p.Grace = 10 * time.Second
	}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return 0, errors.New("supervisor is stopping")
	}
	s.mu.Unlock()
	c := &child{p: p, log: s.log.With("process", p.Name), oomWarning: &s.oomWarning, stop: make(chan struct{}), stopped: make(chan struct{})}
	if err := c.start(); err != nil {
		return 0, err
	}
	if err := c.waitReady(ctx); err != nil {
		close(c.stop)
		c.terminate()
		close(c.stopped)
		return 0, err
	}
	s.mu.Lock()
	s.children = append(s.children, c)
	s.mu.Unlock()
	go c.keepRunning()
	return c.pid(), nil
}

// Stop stops every child, the last started first, and waits for them.
func (s *Supervisor) Stop() error {
	s.mu.Lock()
	s.stopping = true
	children := s.children
	s.children = nil
	s.mu.Unlock()
	var errs []error
	for i := len(children) - 1; i >= 0; i-- {
		errs = append(errs, children[i].shutdown())
	}
	return errors.Join(errs...)
}

func (c *child) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd.Process.Pid
}

// start starts the process once.
func (c *child) start() error {
	// The logs are root's alone: they hold what the daemons print, requests and
	// tenants' names among it. A log or directory left wider by an older bex is
	// tightened (the open keeps an existing file's mode).
	if err := os.MkdirAll(filepath.Dir(c.p.LogPath), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Dir(c.p.LogPath), 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(c.p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if err := logFile.Chmod(0o600); err != nil {
		logFile.Close()
		return err
	}
	cmd := exec.Command(c.p.Path, c.p.Args...)
	cmd.Dir = c.p.Dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	for _, kv := range os.Environ() {
		if c.p.KeepEnv == nil || c.p.KeepEnv(kv) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, c.p.Env...)
	// Own process group: a ^C in the terminal reaches the supervisor alone, which
	// then stops the children in order. Pdeathsig: a supervisor that dies takes
	// its children along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", c.p.Name, err)
	}
	if err := SetOOMScoreAdj(cmd.Process.Pid, c.p.OOMScoreAdj); errors.Is(err, os.ErrPermission) {
		// Without CAP_SYS_RESOURCE (bex up in a container that drops it) a value
		// below the inherited one is refused: the child keeps the supervisor's,
		// still below what tenants get.
		c.oomWarning.Do(func() {
			c.log.Warn("cannot lower oom_score_adj without CAP_SYS_RESOURCE; children keep the supervisor's", "want", c.p.OOMScoreAdj, "err", err)
		})
	} else if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		return fmt.Errorf("start %s: %w", c.p.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	c.mu.Lock()
	c.cmd, c.exited = cmd, exited
	c.mu.Unlock()
	c.log.Debug("started", "pid", cmd.Process.Pid)
	return nil
}

// waitReady polls Ready until it succeeds, the process exits, or the timeout.
func (c *child) waitReady(ctx context.Context) error {
	if c.p.Ready == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.p.ReadyTimeout)
	defer cancel()
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	err := ready.Wait(ctx, 50*time.Millisecond, exited, c.p.Ready)
	var nr *ready.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nr) && nr.Exited:
		return fmt.Errorf("%s exited before it was ready (%s); the end of %s:\n%s", c.p.Name, c.exitState(), c.p.LogPath, Tail(c.p.LogPath, 15))
	case nr != nil:
		return fmt.Errorf("%s not ready after %s: %v; the end of %s:\n%s", c.p.Name, c.p.ReadyTimeout, nr.Last, c.p.LogPath, Tail(c.p.LogPath, 15))
	}
	return err
}

func (c *child) exitState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd.ProcessState == nil {
		return "running"
	}
	return c.cmd.ProcessState.String()
}

// keepRunning restarts the child whenever it exits, until stop.
func (c *child) keepRunning() {
	defer close(c.stopped)
	backoff := MinBackoff
	for {
		c.mu.Lock()
		exited, started := c.exited, time.Now()
		c.mu.Unlock()
		select {
		case <-c.stop:
			return
		case <-exited:
		}
		select {
		case <-c.stop:
			return
		default:
		}
		if time.Since(started) > ResetAfter {
			backoff = MinBackoff
		}
		c.log.Warn("exited; restarting", "state", c.exitState(), "in", backoff, "log", c.p.LogPath, "tail", Tail(c.p.LogPath, 5))
		select {
		case <-c.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, MaxBackoff)
		if err := c.start(); err != nil {
			c.log.Error("restart failed", "err", err)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-c.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := c.waitReady(ctx); err != nil {
			c.log.Error("restarted but not ready", "err", err)
		} else {
			c.log.Info("restarted", "pid", c.pid())
		}
		cancel()
	}
}

// shutdown ends the restart loop and stops the process.
func (c *child) shutdown() error {
	close(c.stop)
	<-c.stopped
	err := c.terminate()
	if c.p.AfterStop != nil {
		c.p.AfterStop()
	}
	return err
}

// terminate sends SIGTERM, then SIGKILL after the grace period, and waits.
func (c *child) terminate() error {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	select {
	case <-exited:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-time.After(c.p.Grace):
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("%s ignored SIGTERM for %s and was killed", c.p.Name, c.p.Grace)
}

// SetOOMScoreAdj sets the oom_score_adj of process pid (0 for the caller). A value
// below the lowest one the process had needs CAP_SYS_RESOURCE; without it the
// error is os.ErrPermission.
func SetOOMScoreAdj(pid, score int) error {
	if score < -1000 || score > 1000 {
		return fmt.Errorf("oom_score_adj %d: want -1000..1000", score)
	}
	proc := "self"
	if pid != 0 {
		proc = strconv.Itoa(pid)
	}
	path := filepath.Join("/proc", proc, "oom_score_adj")
	if err := os.WriteFile(path, []byte(strconv.Itoa(score)), 0); err != nil {
		return fmt.Errorf("set %s to %d: %w", path, score, err)
	}
	return nil
}

// Tail returns the last n lines of the file at path, indented, for error messages.
func Tail(path string, n int) string { return ready.LogTail(path, n) }
