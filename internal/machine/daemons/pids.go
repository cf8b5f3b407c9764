package daemons

import (
	"os"
	"strconv"
	"strings"
)

// The machine's process ids (kernel.pid_max) are shared by everyone on it: a tenant
// that forks without end (one RUN step held 5,004 tasks) takes them from the
// platform, whose next fork then fails. Each group of tenants is given a share, so
// that a quarter of them always stays for the platform and the host:
//
//	the apps (the tenants' parent cgroup)   1/2 of pid_max  TenantsPidsMax
//	every build step at once (BuildCgroup)  1/4 of pid_max  BuildPidsMax
//	one build step                          1/4 of that     StepPidsMax
//
// With Linux's default pid_max of 32,768 that is 16,384, 8,192 and 2,048; a
// compiler or test run with -j on many cores stays far below 2,048.

// defaultPidMax is the kernel's default, used when /proc/sys/kernel/pid_max cannot be read.
const defaultPidMax = 32768

// minStepPids is the floor of StepPidsMax, for machines with a tiny pid_max.
const minStepPids = 256

// PidMax is the machine's kernel.pid_max.
func PidMax() int64 {
	data, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return defaultPidMax
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n <= 0 {
		return defaultPidMax
	}
	return n
}

// TenantsPidsMax is the pids limit of the cgroup all the apps' containers run under:
// half the machine's pid_max.
func TenantsPidsMax() int64 { return PidMax() / 2 }

// BuildPidsMax is the pids limit of the build cgroup, shared by every build step
// running at once: a quarter of pid_max.
func BuildPidsMax() int64 { return PidMax() / 4 }

// StepPidsMax is the pids limit of one build step (its OCI spec's
// linux.resources.pids.limit, which the runc wrapper sets): a quarter of
// BuildPidsMax, so that one runaway step leaves room for the others.
func StepPidsMax() int64 { return max(BuildPidsMax()/4, minStepPids) }
