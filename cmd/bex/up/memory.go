package up

import (
	"runtime/debug"
	"slices"
	"strconv"

	"bex.co/bex/internal/machine/supervise"
)

// The Go memory settings of the platform's processes, for a small idle footprint
// (issue 18: bex up with two apps at most 400 MiB resident in all). Every process
// bex up starts is a Go program; left alone, each lets its heap grow to twice the
// live heap (GOGC=100) and keeps what it freed for a while. A soft limit
// (runtime/debug.SetMemoryLimit) and a lower GC target make each give memory back
// sooner; they are soft: a process that needs more gets it, its collector just
// runs more often, so a limit set low costs CPU under load, never a crash.
//
// bex's own components are told on their command line (--go-memory-limit,
// --go-gc-percent: a child's settings are its flags); etcd, kube-apiserver,
// containerd and buildkitd are configured the way Go programs are, by GOMEMLIMIT
// and GOGC in their environment. containerd's environment reaches the shims it
// starts (Go programs too), not the apps: an app's environment is its OCI spec's.
type goMemory struct {
	limit     int64 // bytes; 0 for none
	gcPercent int   // -1 for Go's default
}

const mib = 1 << 20

// goMemoryOf is each process's setting, by the name bex up starts it under.
// The GC target is what makes an idle process small (measured by
// BenchmarkIdleMemory against bex up --go-memory-defaults: with GOGC at 100 each
// held about twice its live heap; 162 MiB anonymous in all with these settings,
// 229 with Go's defaults). kube-apiserver's live heap, about 75 MiB, is mostly the
// API's OpenAPI schemas and REST handlers, built at start and never freed: at GOGC
// 10 it holds 79 MiB anonymous, 92 at 25, 124 at 100; an idle server allocates
// little, so the collector runs seldom either way (its idle CPU, 0.6% of a core,
// did not change). The others go from 50 to 25 for 1-3 MiB each. The limits sit
// well above what each holds idle (9-14 MiB anonymous for bex's components, etcd,
// containerd and buildkitd; about 80 MiB for kube-apiserver), so that they do not
// bind when idle: they bound a burst (a push's pack, a build's export, a large
// list) by making the collector work harder, at most half the CPU (Go's GC CPU
// limiter), rather than letting the heap double.
var goMemoryOf = map[string]goMemory{
	"kube-apiserver": {limit: 192 * mib, gcPercent: 10},
	"etcd":           {limit: 64 * mib, gcPercent: 25},
	"containerd":     {limit: 48 * mib, gcPercent: 25},
	"buildkitd":      {limit: 96 * mib, gcPercent: 25},
	"deployer":       {limit: 64 * mib, gcPercent: 25},
	"edge":           {limit: 64 * mib, gcPercent: 25},
	"gitserver":      {limit: 96 * mib, gcPercent: 25},
}

// flags are the settings as a bex component's flags.
func (m goMemory) flags() []string {
	var args []string
	if m.limit > 0 {
		args = append(args, "--go-memory-limit", strconv.FormatInt(m.limit, 10))
	}
	if m.gcPercent >= 0 {
		args = append(args, "--go-gc-percent", strconv.Itoa(m.gcPercent))
	}
	return args
}

// env is the settings as the Go runtime's environment variables, for the programs
// that are not bex's.
func (m goMemory) env() []string {
	var env []string
	if m.limit > 0 {
		env = append(env, "GOMEMLIMIT="+strconv.FormatInt(m.limit, 10))
	}
	if m.gcPercent >= 0 {
		env = append(env, "GOGC="+strconv.Itoa(m.gcPercent))
	}
	return env
}

// withGoMemory gives proc its goMemoryOf setting: as flags to a bex component, as
// environment to another program; nothing with Config.GoMemoryDefaults.
func (p *Platform) withGoMemory(proc supervise.Process) supervise.Process {
	m, ok := goMemoryOf[proc.Name]
	if !ok || p.cfg.GoMemoryDefaults {
		return proc
	}
	if proc.Path == p.cfg.Bex {
		proc.Args = append(slices.Clip(proc.Args), m.flags()...)
	} else {
		proc.Env = append(slices.Clip(proc.Env), m.env()...)
	}
	return proc
}

// releaseStartupMemory gives the operating system back what bex up's own start
// allocated and no longer uses (the CRDs it installed, the API discovery it waited
// on): after the start bex up only supervises, and without a nudge Go's scavenger
// returns that memory slowly, keeping it resident for minutes (measured: 19 MiB
// anonymous idle without it, 11 with it).
func (p *Platform) releaseStartupMemory() {
	if !p.cfg.GoMemoryDefaults {
		debug.FreeOSMemory()
	}
}
