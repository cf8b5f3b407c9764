package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"bex.co/bex/internal/ready"
)

const usage = `usage: clusterlocal up DIR | down DIR | node DIR   (hack/cluster-local.sh runs it)
       clusterlocal images DIR | volumes-capd DIR | install-capd DIR | unmount-capd DIR
                                                   (hack/cluster-capd.sh runs them)`

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	dir, err := filepath.Abs(os.Args[2])
	if err == nil {
		err = run(os.Args[1], dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster-local: %v\n", err)
		os.Exit(1)
	}
}

func run(cmd, dir string) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root: the node makes a network namespace, mounts and cgroups")
	}
	l, err := newLayout(dir)
	if err != nil {
		return err
	}
	root, err := checkout()
	if err != nil {
		return err
	}
	bin := filepath.Join(root, "bin")
	switch cmd {
	case "up":
		return up(l, root, bin)
	case "down":
		return down(l)
	case "node":
		return runNode(l, bin)
	case "images":
		return capdImages(l, root)
	case "volumes-capd":
		return l.mountAppVolumes()
	case "install-capd":
		return installCAPD(l, root)
	case "unmount-capd":
		return l.unmountAppVolumes()
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// checkout is the repository this program was started from: hack/cluster-local.sh
// runs it with the checkout as its working directory.
func checkout() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(wd, "infra", "bex", "kustomization.yaml")); err != nil {
		return "", fmt.Errorf("run from the checkout's top directory (hack/cluster-local.sh does): %w", err)
	}
	return wd, nil
}

func say(format string, args ...any) { fmt.Fprintf(os.Stderr, "==> "+format+"\n", args...) }

// nodePID is the running node's PID, or 0.
func (l *layout) nodePID() int {
	b, err := os.ReadFile(l.nodePIDFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// startNode starts `clusterlocal node DIR` in the node's network namespace and a
// mount namespace of its own, in a session of its own (it outlives up), and waits
// until it says every daemon is ready.
func (l *layout) startNode() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(l.logFile("node"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	_ = os.Remove(l.path("node.ready"))
	cmd := exec.Command("nsenter", "--net=/run/netns/"+l.netns(), "--",
		"unshare", "--mount", "--propagation", "private", "--", self, "node", l.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	err = ready.Wait(ctx, 200*time.Millisecond, exited, func(context.Context) error {
		_, err := os.Stat(l.path("node.ready"))
		return err
	})
	var nr *ready.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nr) && nr.Exited:
		return fmt.Errorf("the node stopped while starting (%v): %s", exitErr, tail(l.logFile("node"), 15))
	}
	return fmt.Errorf("the node was not ready within 4 minutes: %s", tail(l.logFile("node"), 15))
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return "\n" + strings.Join(lines, "\n")
}
