package local

import (
	"context"
	"os"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// cfsPeriod is the CFS period of a CPU cap, in microseconds (the kernel's default).
const cfsPeriod = 100_000

// limits are the cgroup limits of one instance.
type limits struct {
	// memory is the hard limit in bytes (swap included: an instance does not swap).
	memory int64
	// pids is the most tasks (processes and threads).
	pids int64
	// cpuMillis is the CPU cap in thousandths of a CPU (0: none).
	cpuMillis int64
}

// limitsOf is what an instance of the process type p gets.
func limitsOf(p appv1.ProcessSpec) limits {
	return limits{memory: p.MemoryBytes(), pids: appv1.DefaultPids, cpuMillis: p.CPUMillis()}
}

// cpuShares is the instance's CPU weight as cgroup v1 shares: 1024 per CPU of its
// cap, as the kubelet gives a CPU request, and 1024 (one CPU) without a cap. runc
// turns shares into cpu.weight on cgroup v2 (1024 shares → weight 39, below the
// weight 100 of the platform's own processes).
func (l limits) cpuShares() uint64 {
	if l.cpuMillis <= 0 {
		return 1024
	}
	return uint64(max(2, l.cpuMillis*1024/1000))
}

// idmap is an app's user namespace: container ids 0..size-1 are host ids
// host..host+size-1, for users and groups alike.
type idmap struct {
	host, size uint32
}

func (m idmap) mappings() []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: m.host, Size: m.size}}
}

// securityOpts confine an instance: a user namespace (uid 0 inside is m.host on
// the host), the capability set above, no new privileges, containerd's default
// seccomp profile, /sys read-only from sysfs (a sysfs of the instance's network
// namespace: attachment.sysfs), and the cgroup limits. They are applied after
// the image's config and the namespaces, so the seccomp profile sees the final
// capabilities. The container's cgroup is under the tenants' parent
// (Config.CgroupParent), which bounds the tasks of all of them together.
func securityOpts(l limits, m idmap, sysfs, cgroupParent string) []oci.SpecOpts {
	return []oci.SpecOpts{
		oci.WithUserNamespace(m.mappings(), m.mappings()),
		withCgroupParent(cgroupParent),
		withSysfsBind(sysfs),
		oci.WithCapabilities(runtime.Capabilities),
		oci.WithNoNewPrivileges,
		oci.WithMemoryLimit(uint64(l.memory)),
		withMemorySwap(l.memory),
		oci.WithPidsLimit(l.pids),
		oci.WithCPUShares(l.cpuShares()),
		withCPUCap(l.cpuMillis),
		// Last: the profile allows some syscalls by capability.
		seccomp.WithDefaultProfile(),
	}
}

// withSysfsBind replaces the sysfs mount with a read-only recursive bind of
// source (a sysfs the runtime mounted in the instance's network namespace, so
// that /sys/class/net shows its own devices only; the host's /sys on the host
// network), and mounts the container's own cgroups over /sys/fs/cgroup in a
// cgroup namespace of its own. A user namespace may mount a sysfs only when it
// owns the network namespace the container is in, and an instance joins one it
// does not own (the host's, or one made by CNI): runc 1.1 then fails to start the
// container ("mount sysfs: operation not permitted"); it has no fallback. Docker
// binds the host's /sys in that case, which shows every device of the host,
// every tenant's veth and its byte counters among them: hence the runtime's own
// sysfs of the namespace (sysfs.go). Without the cgroup mount the bind would
// show the host's whole cgroup tree; with it, runc mounts only the container's cgroups
// (v1: a tmpfs with a bind of each controller's directory; v2: cgroup2 in the
// cgroup namespace), read-only, so a process reads its own limits there as Go,
// the JVM and Node do. The default masked paths (/sys/firmware, ...) stay masked.
func withSysfsBind(source string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		return sysfsBind(s, source)
	}
}

func sysfsBind(s *specs.Spec, source string) error {
	mounts := s.Mounts[:0:0]
	for _, mnt := range s.Mounts {
		switch {
		case mnt.Destination == "/sys" && mnt.Type == "sysfs":
			mounts = append(mounts, specs.Mount{Destination: "/sys", Type: "bind", Source: source,
				Options: []string{"rbind", "rro", "nosuid", "noexec", "nodev"}})
		case mnt.Destination == "/sys/fs/cgroup":
			continue // replaced below
		default:
			mounts = append(mounts, mnt)
		}
	}
	s.Mounts = append(mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
		Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	setLinux(s)
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.CgroupNamespace {
			return nil
		}
	}
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	return nil
}

func setLinux(s *specs.Spec) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
}

// withMemorySwap makes the memory limit hold for memory and swap together, so an
// instance over its limit is killed rather than swapped out. On cgroup v1 this
// needs swap accounting (memory.memsw.*): without it there is no swap limit to set
// and runc would refuse the spec.
func withMemorySwap(limit int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if !swapLimitable() || s.Linux == nil || s.Linux.Resources == nil || s.Linux.Resources.Memory == nil {
			return nil
		}
		s.Linux.Resources.Memory.Swap = &limit
		return nil
	}
}

func swapLimitable() bool {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return true // cgroup v2: memory.swap.max
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// withCPUCap sets a CFS quota of cpuMillis/1000 CPUs (none for 0).
func withCPUCap(cpuMillis int64) oci.SpecOpts {
	if cpuMillis <= 0 {
		return func(context.Context, oci.Client, *containers.Container, *specs.Spec) error { return nil }
	}
	return oci.WithCPUCFS(cpuMillis*cfsPeriod/1000, cfsPeriod)
}
