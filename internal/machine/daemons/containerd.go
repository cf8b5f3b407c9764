package daemons

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
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
	// that every container (an app's, a build step's) starts with that value,
	// and that confines build steps (runcWrapper). Without it a container
	// inherits its shim's oom_score_adj, which is containerd's plus one: a
	// protected containerd would protect every tenant with it.
	Runc              string
	TenantOOMScoreAdj int
	// Jq is the jq the wrapper rewrites build steps' specs with; empty: jq in PATH.
	Jq string
	// StepPids is each build step's pids limit; 0 is StepPidsMax().
	StepPids int64
	// BuildCgroup, when set, is the build cgroup's name (BuildCgroup.Name): a
	// step whose cgroup path is not below it (an LLB exec names its own cgroup
	// parent) is put there, at BuildCgroup/buildkit/<container id>, under the
	// limits all the steps share.
	BuildCgroup string
}

// runcWrapper raises its own oom_score_adj (always allowed, and the kernel then
// refuses to lower it again without CAP_SYS_RESOURCE) and becomes runc; runc's
// children, the container's processes, inherit the value. A spec that sets
// process.oomScoreAdj still wins: runc writes it.
//
// Build steps are tenants too, and buildkitd's containerd worker takes no
// per-step security options, so the wrapper confines them here, before runc reads
// their spec. A step is a container whose cgroup path ends in buildkit/<id>
// (buildkitd puts every step there under its cgroup parent) or that has no user
// namespace: buildkitd's steps never have one, every app's container has one
// (deployer/runtime/local), and an LLB exec may name any cgroup parent (the
// builder pins the built-in Dockerfile frontend, but buildkitd itself would run
// any frontend's LLB), so the path alone would let such a step out. A step gets
//   - no CAP_NET_RAW (raw packets: spoofing on the builds' network) and no
//     CAP_MKNOD (device nodes) in any capability set,
//   - no_new_privs (a setuid binary in a base image gains nothing),
//   - linux.resources.pids.limit at most StepPids (a fork bomb fails in its step),
//   - with BuildCgroup, a cgroup path below it (else the step's own choice
//     would leave the steps' shared memory and pids limits),
//   - no bind mount of buildkitd's OTel socket (/dev/otel-grpc.sock: a way into a
//     platform daemon; buildkitd mounts it into every step when the file exists).
//
// `runc create` (and run) has its bundle's config.json rewritten; `runc exec`
// (a process started in a running step: buildkit's interactive containers) has
// its --process file confined the same way when its container is a step. A spec
// the wrapper cannot read is refused: nothing runs unconfined by mistake.
// buildkitd already gives each step the default seccomp profile.
const runcWrapper = `#!/bin/sh
# Written by bex: containers start with the tenants' oom_score_adj, and build
# steps are confined (internal/machine/daemons/containerd.go, runcWrapper).
echo %[1]d > /proc/self/oom_score_adj || exit 1
runc=%[2]s
jq=%[3]s
pids=%[4]d
cgroup=%[5]s
step='((.linux.cgroupsPath // "") | test("(^|/)buildkit/[^/]+$")) or ([(.linux.namespaces // [])[] | select(.type == "user")] | length == 0)'
defs='def confine: .capabilities |= (if . == null then null else with_entries(.value |= (if type == "array" then map(select(. != "CAP_NET_RAW" and . != "CAP_MKNOD")) else . end)) end) | .noNewPrivileges = true;'
config_prog="$defs"' if '"$step"' then
	.process |= confine
	| (.linux.resources.pids.limit // 0) as $l
	| .linux.resources.pids.limit = (if $l > 0 and $l < $pids then $l else $pids end)
	| .mounts = ((.mounts // []) | map(select(.destination != "/dev/otel-grpc.sock")))
	| if $cg != "" and ((.linux.cgroupsPath // "") | test("^/" + $cg + "/buildkit/[^/]+$") and (test("/[.]{1,2}$") | not) | not)
	  then .linux.cgroupsPath = "/" + $cg + "/buildkit/" + $id else . end
	else false end'

# The command (the first word that is neither a flag nor a flag's value), and
# the values of --root, --bundle and --process; the container id comes last.
cmd= root=/run/runc bundle=. process= want= last=
for a in "$@"; do
	last=$a
	if [ -n "$want" ]; then
		case $want in
		root) root=$a ;;
		bundle) bundle=$a ;;
		process) process=$a ;;
		esac
		want=
		continue
	fi
	case $a in
	--root) want=root ;;
	--root=*) root=${a#--root=} ;;
	--bundle | -b) want=bundle ;;
	--bundle=*) bundle=${a#--bundle=} ;;
	--process | -p) want=process ;;
	--process=*) process=${a#--process=} ;;
	--log | --log-format | --criu | --pid-file | --console-socket | --preserve-fds | --cwd | --env | -e | --user | -u | --additional-gids | -g | --process-label | --apparmor | --cap | -c | --cgroup) want=value ;;
	-*) ;;
	*) [ -z "$cmd" ] && cmd=$a ;;
	esac
done

# rewrite FILE PROGRAM [ARGS]: FILE through jq's PROGRAM, in place, unless it
# prints false: 0 when rewritten, 1 when not. Exits on a FILE it cannot read:
# nothing runs unconfined by mistake.
rewrite() {
	f=$1 prog=$2
	shift 2
	"$jq" -e "$@" "$prog" "$f" > "$f.bex"
	case $? in
	0) mv "$f.bex" "$f" && return 0 ;;
	1) rm -f "$f.bex"; return 1 ;;
	esac
	rm -f "$f.bex"
	echo "bex runc wrapper: cannot read $f" >&2
	exit 1
}

# maybe_step CONFIG: whether CONFIG may be a build step's spec, so that jq must
# read it: it names buildkit, or has no user namespace (containerd writes compact
# JSON; a spec written otherwise is read by jq). An app's is not read by jq.
maybe_step() {
	grep -q buildkit "$1" || ! grep -q '"type":"user"' "$1"
}

# is_step CONFIG: whether CONFIG is a build step's spec.
is_step() {
	maybe_step "$1" || return 1
	"$jq" -e "$step" "$1" > /dev/null
	case $? in
	0) return 0 ;;
	1) return 1 ;;
	esac
	echo "bex runc wrapper: cannot read $1" >&2
	exit 1
}

case $cmd in
create | run)
	# One jq for a step's spec; none for an app's.
	if maybe_step "$bundle/config.json"; then
		rewrite "$bundle/config.json" "$config_prog" --argjson pids "$pids" --arg cg "$cgroup" --arg id "$last" || true
	fi
	;;
exec)
	if [ -n "$process" ]; then
		b=$("$runc" --root "$root" state "$last" | "$jq" -r .bundle) || exit 1
		if is_step "$b/config.json"; then rewrite "$process" "$defs confine"; fi
	fi
	;;
esac
exec "$runc" "$@"
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
		jq := c.Jq
		if jq == "" {
			var err error
			if jq, err = exec.LookPath("jq"); err != nil {
				return nil, errors.New("jq is not installed: containerd's runc wrapper confines build steps with it (run: apt-get install jq)")
			}
		}
		pids := c.StepPids
		if pids <= 0 {
			pids = StepPidsMax()
		}
		if strings.ContainsAny(c.BuildCgroup, "/.") && c.BuildCgroup != "" {
			return nil, fmt.Errorf("build cgroup %q: want a name, not a path", c.BuildCgroup)
		}
		script := fmt.Sprintf(runcWrapper, c.TenantOOMScoreAdj, shellQuote(c.Runc), shellQuote(jq), pids, shellQuote(c.BuildCgroup))
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
