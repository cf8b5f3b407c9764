package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
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

	proc *process
}

const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %[3]q

[ttrpc]
  address = "%[3]s.ttrpc"

[debug]
  address = "%[3]s.debug"

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
`

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
	c := &Containerd{
		Address: filepath.Join(dir, "containerd.sock"),
		Root:    filepath.Join(dir, "root"),
	}
	config := filepath.Join(dir, "config.toml")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	content := fmt.Sprintf(containerdConfig, c.Root, filepath.Join(dir, "state"), c.Address, filepath.Join(dir, "opt"))
	if err := os.WriteFile(config, []byte(content), 0o644); err != nil {
		return nil, err
	}
	c.proc, err = startProcess(dir, "containerd", bin, []string{"--config", config})
	if err != nil {
		return nil, err
	}
	err = c.proc.waitReady(30*time.Second, func(ctx context.Context) error {
		cl, err := c.Client()
		if err != nil {
			return err
		}
		defer cl.Close()
		_, err = cl.Version(ctx)
		return err
	})
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// Client connects to the daemon, with Namespace as the default namespace.
func (c *Containerd) Client() (*containerd.Client, error) {
	return containerd.New(c.Address, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(5*time.Second))
}

// Stop kills the tasks that tests left running, stops containerd, ends its shims and
// unmounts their snapshots.
func (c *Containerd) Stop() error {
	var errs []error
	if cl, err := c.Client(); err == nil {
		errs = append(errs, killAllTasks(cl))
		cl.Close()
	}
	errs = append(errs, c.proc.stop(10*time.Second))
	killProcessesWithArg(c.Address)
	return errors.Join(errs...)
}

// killAllTasks ends every task in every namespace, so that their shims exit and
// their mounts go away.
func killAllTasks(cl *containerd.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nss, err := cl.NamespaceService().List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		containers, err := cl.Containers(nctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ctr := range containers {
			if task, err := ctr.Task(nctx, nil); err == nil {
				_ = task.Kill(nctx, syscall.SIGKILL)
				_, _ = task.Delete(nctx, containerd.WithProcessKill)
			}
			_ = ctr.Delete(nctx, containerd.WithSnapshotCleanup)
		}
	}
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
