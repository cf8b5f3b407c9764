package main

import (
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

// upTimeout bounds the wait for a serve process to be ready.
const upTimeout = 3 * time.Minute

// logHeader begins the line that up writes into capdmgmt.log before each serve it
// starts: what follows is that serve's.
const logHeader = "---- capdmgmt up "

// up starts the management plane of DIR unless it runs already, and waits until it
// is ready.
func up(l layout) error {
	began := time.Now()
	if err := os.MkdirAll(l.logs(), 0o700); err != nil {
		return err
	}
	// Two ups at once would start two serves: the second waits for the first.
	unlock, err := lock(l.path("up.lock"))
	if err != nil {
		return err
	}
	defer unlock()

	if pid := l.servePID(); pid != 0 {
		if l.isReady() {
			say("the management plane of %s runs (PID %d): KUBECONFIG=%s", l.dir, pid, l.kubeconfig())
			return nil
		}
		// Started by an up that gave up on it, or by hand: wait for it rather than
		// start a second one.
		say("the management plane of %s is starting (PID %d); waiting for it", l.dir, pid)
		exited := make(chan struct{})
		go func() {
			for l.isServe(pid) {
				time.Sleep(200 * time.Millisecond)
			}
			close(exited)
		}()
		return l.waitReady(pid, exited, began, nil)
	}

	root, err := checkout()
	if err != nil {
		return err
	}
	if _, err := preflight(root); err != nil {
		return err
	}
	_ = os.Remove(l.readyFile())
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(l.logFile("capdmgmt"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "%s%s at %s\n", logHeader, l.dir, time.Now().Format(time.RFC3339))
	// Its own session: serve outlives up and the terminal up ran in. Its argv[0]
	// is "capdmgmt" wherever the binary is, so that down and the next up know it
	// by its command line.
	cmd := exec.Command(self, "serve", l.dir)
	cmd.Args[0] = "capdmgmt"
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start capdmgmt serve: %w", err)
	}
	say("starting the management plane of %s (PID %d, log %s)", l.dir, cmd.Process.Pid, l.logFile("capdmgmt"))
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return l.waitReady(cmd.Process.Pid, exited, began, cmd)
}

// waitReady waits until DIR/mgmt/ready appears or process pid exits. When it is not
// ready in time and up started it (own), it is stopped.
func (l layout) waitReady(pid int, exited chan struct{}, began time.Time, own *exec.Cmd) error {
	ctx, cancel := context.WithTimeout(context.Background(), upTimeout)
	defer cancel()
	err := ready.Wait(ctx, 200*time.Millisecond, exited, func(context.Context) error {
		if !l.isReady() {
			return errors.New(l.readyFile() + " is not there yet")
		}
		return nil
	})
	var nr *ready.Error
	switch {
	case err == nil:
		say("the management plane of %s is ready (%.1f s): KUBECONFIG=%s", l.dir, time.Since(began).Seconds(), l.kubeconfig())
		return nil
	case errors.As(err, &nr) && nr.Exited:
		lines := thisRun(l.logFile("capdmgmt"))
		if own != nil && own.ProcessState.Success() {
			return errors.New("the management plane was stopped while it started (by capdmgmt down, or a signal): run capdmgmt up again")
		}
		if msg := lastError(lines); msg != "" {
			return fmt.Errorf("the management plane stopped while starting: %s", msg)
		}
		return fmt.Errorf("the management plane stopped while starting; the end of %s says why:\n%s", l.logFile("capdmgmt"), tail(lines, 20))
	}
	if own != nil {
		_ = stopServe(l, pid)
	}
	return fmt.Errorf("the management plane was not ready within %s (stopped; the end of %s says where it was):\n%s", upTimeout, l.logFile("capdmgmt"), tail(thisRun(l.logFile("capdmgmt")), 20))
}

// lock takes an exclusive lock on the file at path, waiting for it.
func lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// thisRun is the lines that the last serve started by up wrote into its log at
// path (after up's header line).
func thisRun(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], logHeader) {
			return lines[i+1:]
		}
	}
	return lines
}

// lastError is the error the last serve ended with ("capdmgmt: ..." from main),
// or "".
func lastError(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if msg, ok := strings.CutPrefix(lines[i], "capdmgmt: "); ok {
			return msg
		}
	}
	return ""
}

// tail is the last n of lines, indented.
func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}
