package daemons_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bkclient "github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"

	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/testenv"
)

// builds is a containerd with Debian's busybox as its base image and a buildkitd
// whose containerd worker builds into it, its steps under a build cgroup, as bex
// up runs them.
type builds struct {
	bk  *testenv.Buildkitd
	dir string // buildkitd's
	n   int
}

// startBuilds starts them; stop ends both.
func startBuilds(tb testing.TB, opts ...testenv.ContainerdOption) (*builds, func()) {
	tb.Helper()
	dir := tb.TempDir()
	bdir := filepath.Join(dir, "buildkitd")
	cg := daemons.BuildCgroupFor(bdir, 512<<20)
	c, err := testenv.StartContainerd(filepath.Join(dir, "containerd"), append([]testenv.ContainerdOption{testenv.WithBuildCgroup(cg.Name)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := testenv.BusyboxImage(ctx, c, filepath.Join(dir, "busybox")); err != nil {
		_ = c.Stop()
		tb.Fatal(err)
	}
	bk, err := testenv.StartBuildkitd(bdir, c, testenv.WithBuildMemory(cg.Memory))
	if err != nil {
		_ = c.Stop()
		tb.Fatal(err)
	}
	return &builds{bk: bk, dir: bdir}, func() {
		if err := errors.Join(bk.Stop(), c.Stop()); err != nil {
			tb.Error(err)
		}
	}
}

// build builds dockerfile (FROM busybox ...) and returns its steps' output.
func (b *builds) build(tb testing.TB, dockerfile string) (string, error) {
	tb.Helper()
	b.n++
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, out, err := b.bk.BuildImage(ctx, dir, dir, fmt.Sprintf("docker.io/library/confine-%d:latest", b.n))
	return out, err
}

// probeScript prints what confines the step it runs in, one "probe KEY: VALUE"
// line each; probe is a Dockerfile whose RUN step is it.
const probeScript = `grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status | sed 's/^/probe /'; ` +
	`echo "probe uid_map: $(tr -s ' ' < /proc/self/uid_map)"; ` +
	`echo "probe pids.max: $(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max)"; ` +
	`if [ -e /dev/otel-grpc.sock ]; then echo "probe otel: present"; else echo "probe otel: absent"; fi; ` +
	`if mknod /tmp/null c 1 3 2>/dev/null; then echo "probe mknod: made"; else echo "probe mknod: refused"; fi`

const probe = "FROM busybox\nRUN " + probeScript + "\n"

// solveLLB runs script in a busybox exec of raw LLB (what a frontend of the
// tenant's own, `# syntax=`, sends) with the given cgroup parent, and returns
// its output.
func (b *builds) solveLLB(tb testing.TB, script, cgroupParent string) (string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := llb.Image("docker.io/library/busybox:latest", llb.ResolveModePreferLocal).
		Run(llb.Args([]string{"/bin/sh", "-c", script}), llb.WithCgroupParent(cgroupParent), llb.IgnoreCache).Root()
	def, err := st.Marshal(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := b.bk.Client(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	ch := make(chan *bkclient.SolveStatus)
	var out strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := range ch {
			for _, l := range s.Logs {
				out.Write(l.Data)
			}
		}
	}()
	_, err = c.Solve(ctx, def, bkclient.SolveOpt{}, ch)
	<-done
	return out.String(), err
}

func probed(tb testing.TB, out string) map[string]string {
	tb.Helper()
	got := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		if _, rest, ok := strings.Cut(line, "probe "); ok {
			if k, v, ok := strings.Cut(rest, ":"); ok && !strings.Contains(k, " ") {
				got[k] = strings.TrimSpace(v)
			}
		}
	}
	for _, k := range []string{"CapEff", "CapBnd", "CapPrm", "NoNewPrivs", "Seccomp", "uid_map", "pids.max", "otel", "mknod"} {
		if _, ok := got[k]; !ok {
			tb.Fatalf("the probe printed no %s:\n%s", k, out)
		}
	}
	return got
}

const (
	capMknod  = 27
	capNetRaw = 13
	capChown  = 0
)

func hasCap(tb testing.TB, hex string, c uint) bool {
	tb.Helper()
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		tb.Fatalf("capability set %q: %v", hex, err)
	}
	return v&(1<<c) != 0
}

// TestBuildStepsAreConfined runs real builds on a real buildkitd (containerd
// worker, runc from `make tools` through bex's wrapper) whose RUN step prints
// what confines it, and checks each property; then a step that forks past its
// pids limit fails, and an ordinary build (files, a user, chown, su) still works.
// The same probe on the same runc without the wrapper shows what it removes.
func TestBuildStepsAreConfined(t *testing.T) {
	const stepPids = 200
	b, stop := startBuilds(t, testenv.WithStepPids(stepPids))
	defer stop()

	out, err := b.build(t, probe)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := probed(t, out)
	t.Logf("confined step: %v", got)
	for _, set := range []string{"CapEff", "CapBnd", "CapPrm"} {
		if hasCap(t, got[set], capNetRaw) || hasCap(t, got[set], capMknod) {
			t.Errorf("%s %s holds CAP_NET_RAW or CAP_MKNOD", set, got[set])
		}
		if !hasCap(t, got[set], capChown) {
			t.Errorf("%s %s lost CAP_CHOWN, which builds need", set, got[set])
		}
	}
	if got["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %s", got["NoNewPrivs"])
	}
	if got["Seccomp"] != "2" {
		t.Errorf("Seccomp %s: not filtered by the default profile", got["Seccomp"])
	}
	if got["pids.max"] != strconv.Itoa(stepPids) {
		t.Errorf("the step's pids.max is %s, want %d", got["pids.max"], stepPids)
	}
	if got["mknod"] != "refused" {
		t.Errorf("mknod of a character device: %s", got["mknod"])
	}
	if got["otel"] != "absent" {
		t.Errorf("buildkitd's OTel socket is inside the step")
	}
	// It would be there: buildkitd's socket exists, and buildkitd mounts it.
	if _, err := os.Stat(filepath.Join(b.dir, "otel.sock")); err != nil {
		t.Errorf("buildkitd has no OTel socket, so its absence proves nothing: %v", err)
	}
	// All the steps together: a share of pid_max.
	if data, err := os.ReadFile(filepath.Join(b.bk.StepPidsCgroup, "pids.max")); err != nil || strings.TrimSpace(string(data)) != strconv.FormatInt(daemons.BuildPidsMax(), 10) {
		t.Errorf("the build cgroup's pids.max: %q, %v; want %d", data, err, daemons.BuildPidsMax())
	}

	// A step that forks past its limit fails there.
	out, err = b.build(t, "FROM busybox\nRUN i=0; while [ $i -lt 300 ]; do sleep 30 & i=$((i+1)); done; echo spawned $i\n")
	if err == nil || strings.Contains(out, "spawned 300") || !strings.Contains(out, "fork") {
		t.Fatalf("300 processes in a step limited to %d: %v\n%s", stepPids, err, out)
	}

	// Control: an ordinary build still works, and buildkitd lived through the above.
	out, err = b.build(t, `FROM busybox
RUN mkdir -p /app/data && echo hello > /app/data/f && echo 'app:x:1000:1000::/app:/bin/sh' >> /etc/passwd && \
    chown -R 1000:1000 /app && su app -s /bin/sh -c 'echo more >> /app/data/f' && \
    ln -s data/f /app/link && stat -c 'owner %u:%g' /app/data/f && cat /app/link
RUN test "$(cat /app/data/f)" = "$(printf 'hello\nmore')" && echo second step sees it
`)
	if err != nil || !strings.Contains(out, "owner 1000:1000") || !strings.Contains(out, "second step sees it") {
		t.Fatalf("an ordinary build: %v\n%s", err, out)
	}

	// A step under a cgroup of its own choosing (raw LLB names its parent; the
	// systemd form makes buildkitd use it as the whole path) is confined all
	// the same: it has no user namespace.
	out, err = b.solveLLB(t, probeScript+`; echo "probe cgroup: $(grep pids /proc/self/cgroup)"`, "evil.slice:")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	evil := probed(t, out)
	t.Logf("a step under its own cgroup parent: %v", evil)
	if hasCap(t, evil["CapEff"], capNetRaw) || evil["NoNewPrivs"] != "1" || evil["pids.max"] != strconv.Itoa(stepPids) || evil["mknod"] != "refused" || evil["otel"] != "absent" {
		t.Errorf("a step under another cgroup parent is not confined: %v", evil)
	}
	// ... and is put back under the build cgroup, with the other steps' limits.
	if name := filepath.Base(b.bk.StepCgroup); !strings.Contains(evil["cgroup"], "/"+name+"/buildkit/") {
		t.Errorf("a step under another cgroup parent runs in %s, not below %s", evil["cgroup"], name)
	}

	// The same probe on the same runc without the wrapper: what it took away.
	u, stopU := startBuilds(t, testenv.Unconfined())
	defer stopU()
	out, err = u.build(t, probe)
	if err != nil {
		t.Fatalf("unconfined: %v\n%s", err, out)
	}
	base := probed(t, out)
	t.Logf("unconfined step: %v", base)
	if !hasCap(t, base["CapEff"], capNetRaw) || !hasCap(t, base["CapEff"], capMknod) || base["NoNewPrivs"] != "0" || base["otel"] != "present" || base["mknod"] != "made" {
		t.Errorf("without the wrapper the probe sees no difference: %v", base)
	}
}

// BenchmarkBuildStepConfinement measures builds of three RUN steps with the runc
// wrapper that confines each step and, in the same run, without it (the same
// runc): cold, the first build on fresh daemons (the base image's snapshot is
// made), and warm, a second build of new steps on the same daemons.
func BenchmarkBuildStepConfinement(b *testing.B) {
	dockerfile := func(nonce string) string {
		var s strings.Builder
		s.WriteString("FROM busybox\n")
		for i := range 3 {
			fmt.Fprintf(&s, "RUN echo %s-%d > /step%d && chown 100%d:100%d /step%d && ls -ln /step%d\n", nonce, i, i, i, i, i, i)
		}
		return s.String()
	}
	modes := []struct {
		name string
		opts []testenv.ContainerdOption
	}{{"unconfined", []testenv.ContainerdOption{testenv.Unconfined()}}, {"confined", nil}}
	cold := make([]time.Duration, len(modes))
	warm := make([]time.Duration, len(modes))
	for i := 0; i < b.N; i++ {
		for m, mode := range modes {
			b.StopTimer()
			bs, stop := startBuilds(b, mode.opts...)
			b.StartTimer()
			for _, d := range []*time.Duration{&cold[m], &warm[m]} {
				began := time.Now()
				if out, err := bs.build(b, dockerfile(fmt.Sprintf("%s-%d-%d", mode.name, i, bs.n))); err != nil {
					b.Fatalf("%s: %v\n%s", mode.name, err, out)
				}
				*d += time.Since(began)
			}
			b.StopTimer()
			stop()
			b.StartTimer()
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
	for m, mode := range modes {
		b.ReportMetric(ms(cold[m]), mode.name+"-cold-ms")
		b.ReportMetric(ms(warm[m]), mode.name+"-warm-ms")
	}
	b.ReportMetric(ms(warm[1])/ms(warm[0]), "warm-confined/unconfined")
}
