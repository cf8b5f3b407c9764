package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"bex.co/bex/internal/machine/daemons"
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
// Its shims run containers with the runc bex up uses (bin/runc, from `make tools`),
// through the same wrapper, which confines build steps (daemons.Containerd.Runc);
// a runc without the 2025 fixes is refused as bex up refuses it.
func StartContainerd(dir string, opts ...ContainerdOption) (*Containerd, error) {
	bin, err := Binary("containerd")
	if err != nil {
		return nil, err
	}
	runc, err := Binary("runc")
	if err != nil {
		return nil, err
	}
	if _, err := daemons.CheckRunc(runc); err != nil {
		return nil, err
	}
	if _, err := Binary("containerd-shim-runc-v2"); err != nil {
		return nil, err
	}
	o := containerdOptions{Containerd: daemons.Containerd{Dir: dir, Runc: runc}}
	for _, opt := range opts {
		opt(&o)
	}
	d := o.Containerd
	env := d.Env()
	if o.unconfined {
		// The same runc, found first in PATH, with no wrapper between.
		d.Runc = ""
		env = []string{"PATH=" + filepath.Dir(runc) + ":" + os.Getenv("PATH")}
	}
	c := &Containerd{Address: d.Address(), Root: d.Root(), daemon: d}
	args, err := d.WriteConfig()
	if err != nil {
		return nil, err
	}
	c.proc, err = startProcess(dir, "containerd", bin, args, env...)
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

// ContainerdOption changes how StartContainerd configures the daemon.
type ContainerdOption func(*containerdOptions)

type containerdOptions struct {
	daemons.Containerd
	unconfined bool
}

// WithStepPids gives each build step that pids limit instead of
// daemons.StepPidsMax(), so that a test reaches it with a few hundred processes.
func WithStepPids(n int64) ContainerdOption {
	return func(o *containerdOptions) { o.StepPids = n }
}

// WithBuildCgroup names the build cgroup (daemons.BuildCgroup.Name) a build step
// that chose another cgroup parent is put back under, as bex up does; the
// harness's shared containerd, which several buildkitds share, has none.
func WithBuildCgroup(name string) ContainerdOption {
	return func(o *containerdOptions) { o.BuildCgroup = name }
}

// Unconfined runs containers with the same runc but without bex's wrapper: build
// steps are not confined. For the baseline of a benchmark, and for what runs as
// the one-node cluster's containerd runs it (bin/runc, no wrapper: hack/nodeimages).
func Unconfined() ContainerdOption {
	return func(o *containerdOptions) { o.unconfined = true }
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
	return Shared(t, "containerd", func(dir string) (*Containerd, func() error, error) {
		c, err := StartContainerd(dir)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Stop, nil
	})
}
