package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/cmd/bex/up"
	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/testenv"
)

// BenchmarkPushToLive measures, on one `bex up`, the time from the start of
// `git push` to the first HTTPS 200 of the new release:
//
//   - "scratch": a one-line change to the page of a static Go server on a scratch
//     image (testdata/scratchapp), the smallest real app, whose build runs no
//     step: what is left is bex's own path. Its warm push is profiled step by
//     step (scratch-<step>-s), from the moments the pusher's `remote:` lines
//     arrive and from what bex up's components log about the same release (see
//     profile), each step beside its raw baseline measured in the same run
//     (scratch-raw-*: an ssh round trip, C git's receive of the same change into
//     a bare repository, `buildctl build` of the same change into the same
//     containerd, a containerd start of that image to its first 200, and one
//     HTTPS request of the live app through the edge).
//   - "warm": a one-line change to hello-shell, whose RUN step runs again (the
//     build is BuildKit starting a container), beside the same raw steps
//     (raw-*); "cold": a first push of it, a new app.
//
// Last, the memory of the whole platform idle with two apps. BEX_BENCH_LOGS=DIR
// keeps bex up's logs in DIR.
func BenchmarkPushToLive(b *testing.B) {
	p := newPlatform(b)
	b.Cleanup(p.kill)
	p.start(b)
	if dir := os.Getenv("BEX_BENCH_LOGS"); dir != "" {
		// To read a push step by step: bex up's logs, kept where asked.
		b.Cleanup(func() {
			if out, err := exec.Command("cp", "-a", filepath.Join(p.dir, "logs"), dir).CombinedOutput(); err != nil {
				b.Errorf("BEX_BENCH_LOGS: %v\n%s", err, out)
			}
		})
	}
	warm := p.newRepo(b, "hello-shell", "bench-warm")
	if out, err := warm.push(); err != nil {
		b.Fatalf("first push: %v\n%s", err, out)
	}
	second := p.newRepo(b, "hello-procfile", "bench-second")
	if out, err := second.push(); err != nil {
		b.Fatalf("first push: %v\n%s", err, out)
	}
	scratchDir := scratchApp(b, "scratch 0")
	scratch := p.newRepoFrom(b, scratchDir, "bench-scratch")
	if out, err := scratch.push(); err != nil {
		b.Fatalf("first push: %v\n%s", err, out)
	}
	// C git's receive of the same commits, the baseline of bex's.
	bare := filepath.Join(b.TempDir(), "scratch.git")
	scratch.git(b, "init", "-q", "--bare", bare)
	scratch.git(b, "push", "-q", bare, "main")
	// The platform idle with three apps.
	time.Sleep(2 * time.Second) // no wait: the idle spell whose memory is measured
	idle := p.residentShares(b)

	var cold, hot, raw, fast, fastRaw timings
	for i := 0; i < b.N; i++ {
		r := p.newRepo(b, "hello-shell", fmt.Sprintf("bench-cold-%d", i))
		cold.add(p.timePush(b, r, fmt.Sprintf("bench-cold-%d", i), "hello from bex").steps())

		body := fmt.Sprintf("change %d", i)
		warm.commit(b, body, map[string]string{"Dockerfile": shellDockerfile(b, body)})
		hot.add(p.timePush(b, warm, "bench-warm", body).steps())
		raw.add(p.rawSteps(b, i))

		page := fmt.Sprintf("scratch %d", i+1)
		scratch.commit(b, page, map[string]string{"index.html": page + "\n"})
		push := p.timePush(b, scratch, "bench-scratch", page)
		fast.add(p.profile(b, "bench-scratch", push))
		fastRaw.add(p.rawScratch(b, scratch, bare, i))
	}
	cold.report(b, "cold")
	hot.report(b, "warm")
	raw.report(b, "raw")
	sum := raw.mean("ssh") + raw.mean("build") + raw.mean("start")
	b.ReportMetric(sum, "raw-sum-s")
	b.ReportMetric(hot.mean("total")/sum, "warm/raw-sum")
	fast.report(b, "scratch")
	fastRaw.report(b, "scratch-raw")
	fastSum := fastRaw.mean("receive") + fastRaw.mean("build") + fastRaw.mean("start") + fastRaw.mean("request")
	b.ReportMetric(fastSum, "scratch-raw-sum-s")
	b.ReportMetric(fast.mean("total")/fastSum, "scratch/raw-sum")
	fast.table(b, fastRaw)
	reportShares(b, idle)
}

// BenchmarkIdleMemory measures the resident memory of one `bex up` idle with two
// apps, by process (residentShares), without the pushes BenchmarkPushToLive times:
// the quick measure for tuning the platform's memory. The budget is 400 MiB in all.
// The baseline, in the same run, is the same platform with every process at Go's
// memory defaults (bex up --go-memory-defaults: no soft limit, GOGC 100), so that
// tuned/go-defaults says what the Go settings save; what the API server's flags
// save is in both.
func BenchmarkIdleMemory(b *testing.B) {
	tuned := idleShares(b)
	reportShares(b, tuned)
	defaults := idleShares(b, "--go-memory-defaults")
	t, d := total(tuned), total(defaults)
	b.ReportMetric(d.RSS, "go-defaults-idle-2-apps-MB")
	b.ReportMetric(d.PSS, "go-defaults-idle-2-apps-PSS-MB")
	b.ReportMetric(t.RSS/d.RSS, "tuned/go-defaults-RSS")
	b.ReportMetric(t.PSS/d.PSS, "tuned/go-defaults-PSS")
}

// idleShares starts bex up with extra flags, pushes two apps, lets it idle and
// returns its memory by process; the platform is stopped before it returns.
func idleShares(b *testing.B, extra ...string) map[string]memShare {
	p := newPlatform(b)
	defer p.kill()
	p.start(b, extra...)
	for _, app := range [][2]string{{"hello-shell", "idle-one"}, {"hello-procfile", "idle-two"}} {
		if out, err := p.newRepo(b, app[0], app[1]).push(); err != nil {
			b.Fatalf("first push of %s: %v\n%s", app[1], err, out)
		}
	}
	for i := 0; i < b.N; i++ {
		time.Sleep(2 * time.Second) // no wait: the idle spell whose memory is measured
	}
	label := "tuned"
	if len(extra) > 0 {
		label = strings.Join(extra, " ")
	}
	b.Logf("bex up (%s), idle with two apps:", label)
	return p.residentShares(b)
}

// shellDockerfile is the hello-shell Dockerfile with its page saying body: a
// one-line change of a RUN step.
func shellDockerfile(b testing.TB, body string) string {
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join(root, "hack", "samples", "hello-shell", "Dockerfile"))
	if err != nil {
		b.Fatal(err)
	}
	return strings.Replace(string(df), "echo 'hello from bex'", "echo '"+body+"'", 1)
}

// timings collects named durations, in seconds, over iterations.
type timings map[string][]float64

func (t *timings) add(m map[string]float64) {
	if *t == nil {
		*t = timings{}
	}
	for k, v := range m {
		(*t)[k] = append((*t)[k], v)
	}
}

func (t timings) mean(k string) float64 {
	var s float64
	for _, v := range t[k] {
		s += v
	}
	return s / float64(len(t[k]))
}

func (t timings) report(b *testing.B, prefix string) {
	for k := range t {
		b.ReportMetric(t.mean(k), prefix+"-"+k+"-s")
	}
}

// pushTimes is one push as its pusher saw it: when it began, and when each
// step's `remote:` line arrived, git ended and the app first answered.
type pushTimes struct {
	began time.Time
	marks map[string]time.Duration
	out   string
}

// pushMarks are the lines that end a push's steps, by the step they end.
var pushMarks = map[string]string{
	"received": "-----> Building",
	"built":    "-----> Built",
	"recorded": "-----> Deploying release",
	"deployed": "-----> Application deployed",
}

// steps are the push's steps, in seconds: receive (ssh, pack, refs checked),
// build (the builder: export, solve, the image into containerd), release (the
// release recorded), rollout (until the gitserver saw it serve), ref (the branch
// moved and git told), route (from git's end to the app's first 200 through the
// edge) and the total.
func (t pushTimes) steps() map[string]float64 {
	m := t.marks
	return map[string]float64{
		"total":   m["live"].Seconds(),
		"receive": m["received"].Seconds(),
		"build":   (m["built"] - m["received"]).Seconds(),
		"release": (m["recorded"] - m["built"]).Seconds(),
		"rollout": (m["deployed"] - m["recorded"]).Seconds(),
		"ref":     (m["pushed"] - m["deployed"]).Seconds(),
		"route":   (m["live"] - m["pushed"]).Seconds(),
	}
}

// at is the wall-clock time of mark.
func (t pushTimes) at(mark string) time.Time { return t.began.Add(t.marks[mark]) }

// timePush pushes r and returns when app answers with want, with the moments
// the gitserver's lines arrived.
func (p *platform) timePush(b testing.TB, r *repo, app, want string) pushTimes {
	cmd := exec.Command("git", "push", "bex", "main")
	cmd.Dir, cmd.Env = r.dir, r.env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	marks := map[string]time.Duration{}
	var out strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		for mark, prefix := range pushMarks {
			if _, seen := marks[mark]; !seen && strings.Contains(line, prefix) {
				marks[mark] = time.Since(start)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("push %s: %v\n%s", app, err, out.String())
	}
	marks["pushed"] = time.Since(start)
	for {
		if p.answers(app, "/", want)() == nil {
			break
		}
		if time.Since(start) > time.Minute {
			b.Fatalf("%s did not answer %q within a minute of the push", app, want)
		}
		time.Sleep(5 * time.Millisecond) // no wait: the poll that is measured, 5 ms its resolution
	}
	marks["live"] = time.Since(start)
	if len(marks) != len(pushMarks)+2 {
		b.Fatalf("push output lacks a step (%v):\n%s", marks, out.String())
	}
	return pushTimes{began: start, marks: marks, out: out.String()}
}

// rawSteps does what a push does, without bex: an ssh round trip to the same
// server, buildctl building the same kind of one-line change of the app into the
// same containerd (a RUN step that runs again, as the push's did), and a containerd
// start of that image until it answers.
func (p *platform) rawSteps(b testing.TB, i int) map[string]float64 {
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(root, "hack", "samples", "hello-shell")+"/.", dir).CombinedOutput(); err != nil {
		b.Fatalf("copy sample: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(shellDockerfile(b, fmt.Sprintf("raw change %d", i))), 0o644); err != nil {
		b.Fatal(err)
	}

	ssh := time.Now()
	fields := strings.Fields(p.sshCommand())
	// Any command costs the handshake, the session and the exit status.
	_ = exec.Command(fields[0], append(fields[1:], "-p", p.port(p.sshAddr), "git@127.0.0.1", "whoami")...).Run()
	sshTook := time.Since(ssh)

	buildctl, err := testenv.Binary("buildctl")
	if err != nil {
		b.Fatal(err)
	}
	image := fmt.Sprintf("bench.local/raw:%d", i)
	// The same change as the push's, so that BuildKit's cache is as warm for both.
	build := time.Now()
	out, err := exec.Command(buildctl, "--addr", "unix://"+filepath.Join(p.dir, "buildkitd", "buildkitd.sock"), "build",
		"--frontend", "dockerfile.v0", "--local", "context="+dir, "--local", "dockerfile="+dir,
		"--opt", "image-resolve-mode=local", "--output", "type=image,name="+image+",unpack=true").CombinedOutput()
	if err != nil {
		b.Fatalf("buildctl: %v\n%s", err, out)
	}
	buildTook := time.Since(build)

	startTook := p.startUntil200(b, image)
	return map[string]float64{"ssh": sshTook.Seconds(), "build": buildTook.Seconds(), "start": startTook.Seconds()}
}

// startUntil200 runs image in bex up's containerd on the host network with a free
// PORT and returns how long it took until it answered 200; then it removes it.
func (p *platform) startUntil200(b testing.TB, image string) time.Duration {
	cl, err := daemons.ContainerdClient(filepath.Join(p.dir, "containerd", "containerd.sock"), up.ContainerdNamespace)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port, err := testenv.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	id := fmt.Sprintf("bench-raw-%d", time.Now().UnixNano())
	began := time.Now()
	img, err := cl.GetImage(ctx, image)
	if err != nil {
		b.Fatal(err)
	}
	ctr, err := cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithHostNamespace(specs.NetworkNamespace), oci.WithEnv([]string{"PORT=" + strconv.Itoa(port)})))
	if err != nil {
		b.Fatal(err)
	}
	defer ctr.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup)
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		b.Fatal(err)
	}
	defer task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
	if err := task.Start(ctx); err != nil {
		b.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	for {
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				took := time.Since(began)
				_ = task.Kill(ctx, syscall.SIGKILL)
				return took
			}
		}
		if ctx.Err() != nil {
			b.Fatalf("%s did not answer on %s", image, url)
		}
		time.Sleep(2 * time.Millisecond) // no wait: the poll that is measured, 2 ms its resolution
	}
}

// memShare is the memory of one share of the platform (a process, or a group: the
// shims, the apps), in MiB: RSS counts every page a process maps, so a binary's
// pages count once in each process that runs it; PSS counts a page mapped by n
// processes 1/n in each, what the platform takes from the machine; Anon is the
// processes' own memory (heap, stacks), the part no other process shares.
type memShare struct{ RSS, PSS, Anon, File float64 }

// total sums shares.
func total(shares map[string]memShare) memShare {
	var t memShare
	for _, s := range shares {
		t.RSS, t.PSS, t.Anon, t.File = t.RSS+s.RSS, t.PSS+s.PSS, t.Anon+s.Anon, t.File+s.File
	}
	return t
}

// residentShares is the memory of bex up and every process it started, directly
// or through containerd, by process: bex up, each bex component (deployer, edge,
// gitserver: a bex child is named by its subcommand), etcd, kube-apiserver,
// containerd, buildkitd, the containerd shims and the app instances (everything
// under a shim). A process none of these names is counted under its command name,
// so that the shares always add up to the total.
func (p *platform) residentShares(b testing.TB) map[string]memShare {
	parent := parentPIDs()
	roots := map[int]bool{p.cmd.Process.Pid: true}
	for _, line := range processesMentioning(p.dir) { // the shims, which daemonise away
		pid, _ := strconv.Atoi(strings.SplitN(line, ":", 2)[0])
		roots[pid] = true
	}
	in := func(pid int) bool {
		for ; pid > 1; pid = parent[pid] {
			if roots[pid] {
				return true
			}
		}
		return false
	}
	comm := func(pid int) string {
		c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(c))
	}
	isShim := func(pid int) bool { return strings.HasPrefix(comm(pid), "containerd-shim") }
	share := func(pid int) string {
		if isShim(pid) {
			return "shims"
		}
		for a := parent[pid]; a > 1; a = parent[a] {
			if isShim(a) {
				return "apps"
			}
		}
		if pid == p.cmd.Process.Pid {
			return "bex-up"
		}
		c := comm(pid)
		if c == "bex" || strings.HasPrefix(c, "bex.") {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 {
				return args[1]
			}
		}
		return c
	}
	shares := map[string]memShare{}
	for pid := range parent {
		if !in(pid) {
			continue
		}
		// smaps_rollup has all four in one read: Rss, Pss, Anonymous and, for the
		// mapped files, Pss_File; RSS of files is Rss minus Anonymous.
		rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue // exited meanwhile, or a zombie
		}
		kb := map[string]float64{}
		for _, l := range strings.Split(string(rollup), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				v, _ := strconv.ParseFloat(f[1], 64)
				kb[f[0]] = v
			}
		}
		name := share(pid)
		s := shares[name]
		s.RSS += kb["Rss:"] / 1024
		s.PSS += kb["Pss:"] / 1024
		s.Anon += kb["Anonymous:"] / 1024
		s.File += (kb["Rss:"] - kb["Anonymous:"]) / 1024
		shares[name] = s
	}
	if len(shares) == 0 {
		b.Fatal("found no process of bex up")
	}
	for name, s := range shares {
		b.Logf("%-16s %6.1f MiB RSS (%6.1f anonymous, %6.1f files), %6.1f MiB PSS", name, s.RSS, s.Anon, s.File, s.PSS)
	}
	t := total(shares)
	b.Logf("%-16s %6.1f MiB RSS (%6.1f anonymous, %6.1f files), %6.1f MiB PSS", "(total)", t.RSS, t.Anon, t.File, t.PSS)
	return shares
}

// idleGoalMB is issue 18's budget: bex up with two apps, all its processes, RSS.
const idleGoalMB = 400

// reportShares reports each process's share of the idle memory (RSS and PSS), the
// totals, and the RSS total against the goal.
func reportShares(b *testing.B, shares map[string]memShare) {
	for name, s := range shares {
		b.ReportMetric(s.RSS, "idle-"+name+"-MB")
		b.ReportMetric(s.PSS, "idle-"+name+"-PSS-MB")
	}
	t := total(shares)
	b.ReportMetric(t.RSS, "platform-idle-2-apps-MB")
	b.ReportMetric(t.PSS, "platform-idle-2-apps-PSS-MB")
	b.ReportMetric(t.RSS/idleGoalMB, "platform-idle-MB/goal")
}

// parentPIDs maps every process of the machine to its parent, from /proc.
func parentPIDs() map[int]int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut after the last ')'.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	return parent
}

// scratchApp writes a FROM-scratch app into a new directory and returns it: the
// static Go server of testdata/scratchapp, built here, and its page.
func scratchApp(b testing.TB, page string) string {
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "server"), "./cmd/bex/e2e/testdata/scratchapp")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the scratch app: %v\n%s", err, out)
	}
	for name, content := range map[string]string{
		"Dockerfile": "FROM scratch\nCOPY server /server\nCOPY index.html /www/index.html\nCMD [\"/server\"]\n",
		"index.html": page + "\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// rawScratch does what a warm push of the scratch app does, without bex, for the
// change the repository's last commit made: C git's receive of it into bare
// (over a pipe, no ssh), buildctl building it into the same containerd, a
// containerd start of that image until it answers, and one HTTPS request of the
// live app through the edge.
func (p *platform) rawScratch(b testing.TB, r *repo, bare string, i int) map[string]float64 {
	receive := time.Now()
	r.git(b, "push", "-q", bare, "main")
	receiveTook := time.Since(receive)

	buildctl, err := testenv.Binary("buildctl")
	if err != nil {
		b.Fatal(err)
	}
	image := fmt.Sprintf("bench.local/raw-scratch:%d", i)
	build := time.Now()
	out, err := exec.Command(buildctl, "--addr", "unix://"+filepath.Join(p.dir, "buildkitd", "buildkitd.sock"), "build",
		"--frontend", "dockerfile.v0", "--local", "context="+r.dir, "--local", "dockerfile="+r.dir,
		"--opt", "image-resolve-mode=local", "--output", "type=image,name="+image+",unpack=true").CombinedOutput()
	if err != nil {
		b.Fatalf("buildctl: %v\n%s", err, out)
	}
	buildTook := time.Since(build)
	startTook := p.startUntil200(b, image)

	request := time.Now()
	if err := p.answers("bench-scratch", "/", "scratch")(); err != nil {
		b.Fatal(err)
	}
	return map[string]float64{"receive": receiveTook.Seconds(), "build": buildTook.Seconds(),
		"start": startTook.Seconds(), "request": time.Since(request).Seconds()}
}

// profile splits a warm push of app into its steps, in seconds: the pusher's
// (pushTimes.steps) and, inside build and rollout, what bex up's components
// logged about the same commit and release:
//
//   - export, solve: the builder writing the commit's files out, and BuildKit's
//     solve with the image's export and unpack into containerd ("build done");
//   - reaction: from the release's `remote:` line to the runtime beginning its
//     instance (the deployer's watch, its reconcile, the runtime's checks);
//   - network, create (with remap, the image's copy for the app's ids), task
//     (containerd's task made and started; new-task its making: the shim and
//     runc create) and health (the start to the first
//     check that passed): "instance started" and "instance ready";
//   - switch: ready to the endpoints switched ("release serves");
//   - status: the switch to the gitserver's "Application deployed";
//   - rest: what no step accounts for.
func (p *platform) profile(b testing.TB, app string, push pushTimes) map[string]float64 {
	steps := push.steps()
	m := regexp.MustCompile(`Deploying release v(\d+)`).FindStringSubmatch(push.out)
	if m == nil {
		b.Fatalf("no release in the push's output:\n%s", push.out)
	}
	release := m[1]
	built := p.logLine(b, "gitserver", `msg="build done"`, "builder.app="+app+" ")
	started := p.logLine(b, "deployer", `msg="instance started"`, "app=default/"+app+" ", "release="+release+" ")
	ready := p.logLine(b, "deployer", `msg="instance ready"`, "app=default/"+app+" ", "release="+release+" ")
	serves := p.logLine(b, "deployer", `msg="release serves"`, "app=default/"+app+" ", "release="+release+" ")

	seconds := func(l logLine, key string) float64 {
		d, err := time.ParseDuration(l.attrs[key])
		if err != nil {
			b.Fatalf("%s=%q in %q: %v", key, l.attrs[key], l.text, err)
		}
		return d.Seconds()
	}
	steps["export"] = seconds(built, "builder.export")
	steps["solve"] = seconds(built, "builder.solve")
	steps["network"] = seconds(started, "network")
	steps["create"] = seconds(started, "create")
	steps["remap"] = seconds(started, "remap")
	steps["task"] = seconds(ready, "task")
	steps["new-task"] = seconds(ready, "new_task")
	steps["health"] = seconds(ready, "after")
	began := started.time.Add(-time.Duration((steps["network"] + steps["create"]) * float64(time.Second)))
	steps["reaction"] = began.Sub(push.at("recorded")).Seconds()
	steps["switch"] = serves.time.Sub(ready.time).Seconds()
	steps["status"] = push.at("deployed").Sub(serves.time).Seconds()
	accounted := 0.0
	for _, k := range []string{"receive", "export", "solve", "release", "reaction", "network", "create", "task", "health", "switch", "status", "ref", "route"} {
		accounted += steps[k]
	}
	steps["rest"] = steps["total"] - accounted
	return steps
}

// logLine is one line of a component's log (log/slog's text format).
type logLine struct {
	time  time.Time
	attrs map[string]string
	text  string
}

var slogAttr = regexp.MustCompile(`([\w.]+)=("(?:[^"\\]|\\.)*"|\S*)`)

// logLine returns the last line of bex up's log of component that contains
// every one of has.
func (p *platform) logLine(b testing.TB, component string, has ...string) logLine {
	data, err := os.ReadFile(filepath.Join(p.dir, "logs", component+".log"))
	if err != nil {
		b.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
next:
	for i := len(lines) - 1; i >= 0; i-- {
		for _, h := range has {
			if !strings.Contains(lines[i], h) {
				continue next
			}
		}
		l := logLine{attrs: map[string]string{}, text: lines[i]}
		for _, kv := range slogAttr.FindAllStringSubmatch(lines[i], -1) {
			l.attrs[kv[1]] = strings.Trim(kv[2], `"`)
		}
		if l.time, err = time.Parse(time.RFC3339Nano, l.attrs["time"]); err != nil {
			b.Fatalf("%s's log line %q: %v", component, lines[i], err)
		}
		return l
	}
	b.Fatalf("%s's log has no line with %q", component, has)
	return logLine{}
}

// table logs the profile's steps in the order a push takes them, each with the
// raw step it compares with.
func (t timings) table(b testing.TB, raw timings) {
	rows := []struct{ step, raw string }{
		{"receive", "receive"}, {"export", ""}, {"solve", "build"}, {"release", ""}, {"reaction", ""},
		{"network", ""}, {"create", ""}, {"remap", ""}, {"task", "start"}, {"new-task", ""}, {"health", ""}, {"switch", ""},
		{"status", ""}, {"ref", ""}, {"route", "request"}, {"rest", ""}, {"total", ""},
	}
	b.Logf("%-9s %8s   %s", "step", "seconds", "raw, same run")
	for _, r := range rows {
		line := fmt.Sprintf("%-9s %8.3f", r.step, t.mean(r.step))
		if r.raw != "" {
			line += fmt.Sprintf("   %-7s %.3f", r.raw, raw.mean(r.raw))
		}
		b.Logf("%s", line)
	}
}
