package testenv

import (
	"errors"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"bex.co/bex/internal/daemons"
)

// Namespace is the containerd namespace that the harness's buildkitd builds into and
// that tests run their containers in.
const Namespace = "bex"

// Containerd is a containerd daemon with its own root, state and socket.
type Containerd struct {
	// Address is the path of its gRPC socket.
	Address string
	// Root is its data directory (content, snapshots, metadata).
	Root string

	proc   *process
	daemon daemons.Containerd
}

// StartContainerd starts containerd (Debian's package) with everything under dir.
func StartContainerd(dir string) (*Containerd, error) {
	bin, err := Binary("containerd")
	if err != nil {
		return nil, err
	}
	if _, err := Binary("runc"); err != nil {
		return nil, err
	}
	if _, err := Binary("containerd-shim-runc-v2"); err != nil {
		return nil, err
	}
	d := daemons.Containerd{Dir: dir}
	c := &Containerd{Address: d.Address(), Root: d.Root(), daemon: d}
	args, err := d.WriteConfig()
	if err != nil {
		return nil, err
	}
	c.proc, err = startProcess(dir, "containerd", bin, args)
	if err != nil {
		return nil, err
	}
	err = c.proc.waitReady(30*time.Second, d.Ready)
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// Client connects to the daemon, with Namespace as the default namespace.
func (c *Containerd) Client() (*containerd.Client, error) {
	return daemons.ContainerdClient(c.Address, Namespace)
}

// Stop kills the tasks that tests left running, stops containerd, ends its shims and
// unmounts their snapshots.
func (c *Containerd) Stop() error {
	errs := []error{daemons.KillAllTasks(c.Address), c.proc.stop(10 * time.Second)}
	daemons.KillProcessesWithArg(c.Address)
	c.daemon.RemoveState()
	return errors.Join(errs...)
}

// SharedContainerd returns the containerd of this test binary, started on first use.
func SharedContainerd(t testing.TB) *Containerd {
	t.Helper()
	return sharedDaemon(t, "containerd", func(dir string) (*Containerd, func() error, error) {
		c, err := StartContainerd(dir)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Stop, nil
	})
}
