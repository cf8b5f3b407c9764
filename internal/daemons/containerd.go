package daemons

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

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

// Containerd is a containerd with everything under Dir.
type Containerd struct {
	Dir string
	// Runc, when set, is the real runc: containerd's shims then run the
	// containers through a wrapper (Dir/bin/runc, found first in the PATH that
	// Env gives) that sets TenantOOMScoreAdj on itself before it execs runc, so
	// that every container (an app's, a build step's) starts with that value.
	// Without it a container inherits its shim's, which is containerd's plus one:
	// a protected containerd would protect every tenant with it.
	Runc              string
	TenantOOMScoreAdj int
}

// runcWrapper raises its own oom_score_adj (always allowed, and the kernel then
// refuses to lower it again without CAP_SYS_RESOURCE) and becomes runc; runc's
// children, the container's processes, inherit the value. A spec that sets
// process.oomScoreAdj still wins: runc writes it.
const runcWrapper = `#!/bin/sh
# Written by bex: containers start with the tenants' oom_score_adj.
echo %d > /proc/self/oom_score_adj || exit 1
exec %s "$@"
`

// Env is the environment containerd runs with: the runc wrapper's directory
// first in PATH when Runc is set.
func (c Containerd) Env() []string {
	if c.Runc == "" {
		return nil
	}
	return []string{"PATH=" + filepath.Join(c.Dir, "bin") + ":" + os.Getenv("PATH")}
}

// Address is the path of its gRPC socket.
func (c Containerd) Address() string { return filepath.Join(c.Dir, "containerd.sock") }

// Root is its data directory (content, snapshots, metadata).
func (c Containerd) Root() string { return filepath.Join(c.Dir, "root") }

// State is its state directory (the containers' bundles), under /run/bex and named
// by a hash of Dir, not inside Dir: runc, in a container's user namespace, reaches
// the bundle as an unprivileged uid, so every directory above it must be searchable
// by others, and a state dir under /root (0700 on Debian) is not. What is there
// lasts as long as the running containers, so tmpfs is the right place.
func (c Containerd) State() string {
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		abs = c.Dir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join("/run/bex", "containerd-"+hex.EncodeToString(sum[:6]))
}

// WriteConfig writes its config.toml and returns the daemon's arguments.
func (c Containerd) WriteConfig() ([]string, error) {
	if err := os.MkdirAll(c.Dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.State(), 0o711); err != nil {
		return nil, err
	}
	if err := searchable(c.State()); err != nil {
		return nil, err
	}
	if c.Runc != "" {
		// runc is run by containerd's shims, as root: nobody else needs it.
		if err := os.MkdirAll(filepath.Join(c.Dir, "bin"), 0o700); err != nil {
			return nil, err
		}
		script := fmt.Sprintf(runcWrapper, c.TenantOOMScoreAdj, shellQuote(c.Runc))
		if err := os.WriteFile(filepath.Join(c.Dir, "bin", "runc"), []byte(script), 0o700); err != nil {
			return nil, err
		}
	}
	config := filepath.Join(c.Dir, "config.toml")
	content := fmt.Sprintf(containerdConfig, c.Root(), c.State(), c.Address(), filepath.Join(c.Dir, "opt"))
	if err := os.WriteFile(config, []byte(content), 0o600); err != nil {
		return nil, err
	}
	return []string{"--config", config}, nil
}

// shellQuote quotes s as one word for /bin/sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Client connects to the daemon with namespace as the default.
func (c Containerd) Client(namespace string) (*containerd.Client, error) {
	return ContainerdClient(c.Address(), namespace)
}

// ContainerdClient connects to the containerd at address with namespace as the default.
func ContainerdClient(address, namespace string) (*containerd.Client, error) {
	return containerd.New(address, containerd.WithDefaultNamespace(namespace), containerd.WithTimeout(5*time.Second))
}

// Ready succeeds once the daemon answers.
func (c Containerd) Ready(ctx context.Context) error {
	cl, err := c.Client("default")
	if err != nil {
		return err
	}
	defer cl.Close()
	_, err = cl.Version(ctx)
	return err
}

// KillAllTasks ends every task in every namespace of the containerd at address and
// deletes the containers, so that their shims exit and their mounts go away.
func KillAllTasks(address string) error { return KillTasks(address) }

// KillTasks is KillAllTasks for the given containerd namespaces only; none means all.
func KillTasks(address string, only ...string) error {
	cl, err := ContainerdClient(address, "default")
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nss := only
	if len(nss) == 0 {
		if nss, err = cl.NamespaceService().List(ctx); err != nil {
			return err
		}
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

// KillProcessesWithArg kills the processes whose command line has arg as one of its
// arguments: containerd's shims, found by the private socket address they were
// given, which is why it is unique to one containerd.
func KillProcessesWithArg(arg string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(cmdline), "\x00") {
			if a == arg {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}

// RemoveState removes what is left of the state directory once containerd and its
// shims have stopped: directories only, the deepest first, and only empty ones, so
// that nothing a task left mounted there is ever touched.
func (c Containerd) RemoveState() {
	var dirs []string
	_ = filepath.WalkDir(c.State(), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i])
	}
}

// searchable checks that every directory from / to dir may be searched by any uid.
// runc, inside a container's user namespace (uid 0 there is an unprivileged host
// uid), bind-mounts the container's rootfs from its bundle under dir: a directory
// on the way that only root may enter makes every container fail with "mount
// rootfs: permission denied".
func searchable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("containerd's directory %s is inside %s, which other users may not search (mode %v): the apps' user namespaces must reach their root filesystems through it; chmod o+x %s, or choose another state dir", abs, d, fi.Mode().Perm(), d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
