package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// parallelApps is how many apps are pushed at once, and parallelGoalS the wall
// time of their pushes that the platform is to keep (the last turn's).
const (
	parallelApps  = 8
	parallelGoalS = 9.4
)

// BenchmarkParallelPushes measures, on one `bex up`, 8 apps pushed at once: the
// wall time from the start of the 8 `git push` (the real git over ssh, each from
// its own clone) until every one has returned success and every app answers its
// new page over HTTPS through the edge (parallel8-s), beside the same one-line
// change pushed to one of them alone (single-s, timed before the 8 in one iteration
// and after them in the next, so that neither always meets the other's
// aftermath). parallel8/8xsingle compares the 8 with the same pushes made one
// after another (8 × single): below 1, pushing at once gains; parallel8/goal
// compares them with the last turn's 9.4 s. The apps are the FROM-scratch app of
// BenchmarkPushToLive (testdata/scratchapp), whose build runs no step, so that
// what is measured is bex's own path under load.
//
// Each of the 8 pushes is profiled as BenchmarkPushToLive profiles its warm push
// (profile): the means of its steps are logged beside the single push's, and
// parallel8-<step>-s and single-<step>-s are the pusher's steps (receive holds
// the wait for a build slot; parallel8-slot-waits counts the pushes that
// waited). Where the time goes under load is mostly whether the CPU suffices:
// the CPU time the platform's processes used for the 8 and for one alone
// (parallel8-platform-cpu-s, single-platform-cpu-s, by process in the log), the
// platform's share of the machine's CPUs over the 8's wall time, the machine's
// busy share (other work on it included) and the API server's requests. Each
// iteration's timeline of the 8 (when each one's build began and ended, its
// release was recorded and served, git returned and the app answered) is
// logged, with the cores the platform's daemons used every 0.25 s. ns/op is an
// iteration's whole time, the single push and the profiling included.
// BEX_BENCH_LOGS=DIR keeps bex up's logs in DIR; BEX_BENCH_UP_FLAGS gives bex
// up more flags (--go-memory-defaults: what the memory settings cost the 8).
func BenchmarkParallelPushes(b *testing.B) {
	p := newPlatform(b)
	b.Cleanup(p.kill)
	p.start(b, strings.Fields(os.Getenv("BEX_BENCH_UP_FLAGS"))...)
	if dir := os.Getenv("BEX_BENCH_LOGS"); dir != "" {
		b.Cleanup(func() {
			if out, err := exec.Command("cp", "-a", filepath.Join(p.dir, "logs"), dir).CombinedOutput(); err != nil {
				b.Errorf("BEX_BENCH_LOGS: %v\n%s", err, out)
			}
		})
	}
	src := scratchApp(b, "first")
	apps := make([]string, parallelApps)
	repos := make([]*repo, parallelApps)
	for k := range apps {
		apps[k] = fmt.Sprintf("par-%d", k)
		repos[k] = p.newRepoFrom(b, src, apps[k])
	}
	// The first pushes, cold and untimed: at once, as the timed ones.
	cold := make([]string, parallelApps)
	errs := make([]error, parallelApps)
	var wg sync.WaitGroup
	for k, r := range repos {
		wg.Go(func() { cold[k], errs[k] = r.push() })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			b.Fatalf("first push of %s: %v\n%s", apps[k], err, cold[k])
		}
	}
	for _, app := range apps {
		testenv.Eventually(b, 30*time.Second, app+" after its first push", p.answers(app, "/", "first"))
	}

	var wall, slowest, fastest, single, waits, busy, busySingle []float64
	var steps, singleSteps, cpu, singleCPU, api, singleAPI timings
	var notes []string // each iteration's, logged after the summary
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	i := 0
	for b.Loop() {
		alone := func() {
			page := fmt.Sprintf("[%s single %d]", apps[0], i)
			repos[0].commit(b, page, map[string]string{"index.html": page + "\n"})
			apiBefore, cpuBefore := p.apiStats(b), p.cpuSeconds()
			before := cpuTicks(b)
			push := p.timePush(b, repos[0], apps[0], page)
			busySingle = append(busySingle, cpuTicks(b).busySince(before))
			singleCPU.add(since(p.cpuSeconds(), cpuBefore))
			singleAPI.add(since(p.apiStats(b), apiBefore))
			single = append(single, push.marks["live"].Seconds())
			singleSteps.add(p.profile(b, apps[0], push))
		}
		if i%2 == 0 {
			alone()
		}

		pages := make([]string, parallelApps)
		for k, r := range repos {
			pages[k] = fmt.Sprintf("[%s parallel %d]", apps[k], i)
			r.commit(b, pages[k], map[string]string{"index.html": pages[k] + "\n"})
		}
		pushes := make([]pushTimes, parallelApps)
		tbs := make([]*pushTB, parallelApps)
		begin := make(chan struct{})
		for k, r := range repos {
			tbs[k] = &pushTB{TB: b}
			wg.Go(func() {
				<-begin
				pushes[k] = p.timePush(tbs[k], r, apps[k], pages[k])
			})
		}
		apiBefore, cpuBefore, stop := p.apiStats(b), p.cpuSeconds(), make(chan struct{})
		trace := p.traceCPU(250*time.Millisecond, stop)
		before := cpuTicks(b)
		t0 := time.Now()
		close(begin)
		wg.Wait()
		took := time.Since(t0)
		busy = append(busy, cpuTicks(b).busySince(before))
		close(stop)
		cores := <-trace
		cpu.add(since(p.cpuSeconds(), cpuBefore))
		api.add(since(p.apiStats(b), apiBefore))
		for k, tb := range tbs {
			if tb.failure != "" {
				b.Fatalf("%s, pushed with %d others: %s", apps[k], parallelApps-1, tb.failure)
			}
		}
		// Every push ended once its app answered: the wall time is the last's.
		wall = append(wall, took.Seconds())
		lives := make([]float64, parallelApps)
		waited := 0
		for k, push := range pushes {
			lives[k] = push.marks["live"].Seconds()
			if strings.Contains(push.out, "Waiting for a build slot") {
				waited++
			}
			steps.add(p.profile(b, apps[k], push))
		}
		sort.Float64s(lives)
		slowest, fastest = append(slowest, lives[len(lives)-1]), append(fastest, lives[0])
		waits = append(waits, float64(waited))
		note("iteration %d: the 8 at once in %.3f s (each %.3f–%.3f s), %d waited for a build slot, the machine's CPU %.0f%% busy",
			i, took.Seconds(), lives[0], lives[len(lives)-1], waited, 100*busy[len(busy)-1])
		notes = append(notes, timeline(t0, apps, pushes)...)
		line := "cores the platform's daemons and components used, by 0.25 s:"
		for _, c := range cores {
			line += fmt.Sprintf(" %.2f", c)
		}
		note("%s", line)

		if i%2 == 1 {
			alone()
		}
		i++
	}

	w, s := mean(wall), mean(single)
	b.ReportMetric(w, "parallel8-s")
	b.ReportMetric(s, "single-s")
	b.ReportMetric(w/s, "parallel8/single")
	b.ReportMetric(w/(parallelApps*s), "parallel8/8xsingle")
	b.ReportMetric(w/parallelGoalS, "parallel8/goal")
	b.ReportMetric(mean(slowest), "parallel8-slowest-s")
	b.ReportMetric(mean(fastest), "parallel8-fastest-s")
	b.ReportMetric(mean(waits), "parallel8-slot-waits")
	// Each push's steps as its pusher saw them (receive holds the wait for a
	// build slot), for the 8 and alone.
	for _, step := range []string{"receive", "build", "release", "rollout"} {
		b.ReportMetric(steps.mean(step), "parallel8-"+step+"-s")
		b.ReportMetric(singleSteps.mean(step), "single-"+step+"-s")
	}
	// Where the CPU went: the platform's (bex up and what it started), its
	// share of the machine's CPUs, and the machine's, whatever ran on it.
	b.ReportMetric(cpu.mean("platform"), "parallel8-platform-cpu-s")
	b.ReportMetric(singleCPU.mean("platform"), "single-platform-cpu-s")
	share := cpu.mean("platform") / (float64(runtime.NumCPU()) * w)
	b.ReportMetric(share, "parallel8-platform-cpu-share")
	b.ReportMetric(mean(busy), "parallel8-machine-busy")
	b.ReportMetric(mean(busySingle), "single-machine-busy")
	// What the control plane was asked.
	b.ReportMetric(api.mean("requests"), "parallel8-api-requests")
	b.ReportMetric(singleAPI.mean("requests"), "single-api-requests")
	b.ReportMetric(api.mean("gc-cycles"), "parallel8-api-gc-cycles")

	b.Logf("the 8 at once: %.3f s (%s), the last turn's %.1f s; one alone: %.3f s; the platform used %.1f CPU-s for the 8 (%.1f for one alone), %.0f%% of the %d CPUs the machine has, %.0f%% busy",
		w, seconds(wall), parallelGoalS, s, cpu.mean("platform"), singleCPU.mean("platform"), 100*share, runtime.NumCPU(), 100*mean(busy))
	b.Logf("%-9s %8s %10s", "step", "single", "each of 8")
	for _, step := range []string{"receive", "export", "solve", "release", "reaction", "network", "create", "remap", "task",
		"new-task", "health", "switch", "status", "ref", "route", "rest", "total"} {
		b.Logf("%-9s %8.3f %10.3f", step, singleSteps.mean(step), steps.mean(step))
	}
	b.Logf("%-22s %8s %8s", "CPU seconds", "the 8", "single")
	side(b, "%-22s %8.3f %8.3f", cpu, singleCPU)
	apiTable(b, api, singleAPI)
	for _, n := range notes {
		b.Logf("%s", n)
	}
}

// seconds lists vs, in seconds, for a log line.
func seconds(vs []float64) string {
	s := make([]string, len(vs))
	for k, v := range vs {
		s[k] = fmt.Sprintf("%.3f", v)
	}
	return strings.Join(s, ", ")
}

// pushTB is the testing.TB of one push inside its own goroutine. FailNow may be
// called only from the benchmark's goroutine, so a Fatal here keeps the message
// and ends this goroutine alone; the benchmark fails with it once every push has
// returned.
type pushTB struct {
	testing.TB
	failure string
}

func (t *pushTB) Fatal(args ...any)                 { t.fail(fmt.Sprint(args...)) }
func (t *pushTB) Fatalf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }
func (t *pushTB) FailNow()                          { t.fail("FailNow") }

func (t *pushTB) fail(msg string) {
	t.failure = msg
	runtime.Goexit()
}

// timeline is, for each push of the 8 in the order their builds began, the
// moments from t0 (the start of all 8) at which its steps ended, as the pusher
// saw them: the build began (its slot taken), ended, the release was recorded,
// served, git returned and the app first answered.
func timeline(t0 time.Time, apps []string, pushes []pushTimes) []string {
	order := make([]int, len(pushes))
	for k := range order {
		order[k] = k
	}
	sort.Slice(order, func(x, y int) bool { return pushes[order[x]].at("received").Before(pushes[order[y]].at("received")) })
	lines := []string{fmt.Sprintf("%-6s %8s %8s %8s %8s %8s %8s  %s", "app", "building", "built", "recorded", "deployed", "pushed", "live", "(s from the start of the 8)")}
	for _, k := range order {
		push := pushes[k]
		line := fmt.Sprintf("%-6s", apps[k])
		for _, mark := range []string{"received", "built", "recorded", "deployed", "pushed", "live"} {
			line += fmt.Sprintf(" %8.3f", push.at(mark).Sub(t0).Seconds())
		}
		if strings.Contains(push.out, "Waiting for a build slot") {
			line += "  waited for a build slot"
		}
		lines = append(lines, line)
	}
	return lines
}

// cpuSeconds is the CPU time, in seconds, that the processes of the platform
// (platformProcesses) and the pushers have used so far, by process, the whole
// platform as "platform", and this process with the git and ssh it ran as
// "pushers". A process counts what it used and what its children that it
// waited for used; a shim that exits is reaped by no process of the platform,
// so what it used is lost.
func (p *platform) cpuSeconds() map[string]float64 {
	s := map[string]float64{"pushers": cpuUsed("self")}
	for pid, name := range p.platformProcesses() {
		t := cpuUsed(strconv.Itoa(pid))
		s[name] += t
		s["platform"] += t
	}
	return s
}

// platformProcesses names every process of bex up by its share, as
// residentShares does: bex up and each of its components (a bex child by its
// subcommand), the daemons by their command names, the containerd shims and the
// app instances (everything under a shim).
func (p *platform) platformProcesses() map[int]string {
	parent := parentPIDs()
	roots := map[int]bool{p.cmd.Process.Pid: true}
	for _, line := range processesMentioning(p.dir) { // the shims, which daemonise away
		pid, _ := strconv.Atoi(strings.SplitN(line, ":", 2)[0])
		roots[pid] = true
	}
	comm := func(pid int) string {
		c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(c))
	}
	procs := map[int]string{}
	for pid := range parent {
		var underShim, inPlatform bool
		for a := pid; a > 1; a = parent[a] {
			if a != pid && strings.HasPrefix(comm(a), "containerd-shim") {
				underShim = true
			}
			if roots[a] {
				inPlatform = true
			}
		}
		switch c := comm(pid); {
		case !inPlatform:
		case underShim:
			procs[pid] = "apps"
		case strings.HasPrefix(c, "containerd-shim"):
			procs[pid] = "shims"
		case pid == p.cmd.Process.Pid:
			procs[pid] = "bex-up"
		case c == "bex" || strings.HasPrefix(c, "bex."):
			procs[pid] = c
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 {
				procs[pid] = args[1]
			}
		default:
			procs[pid] = c
		}
	}
	return procs
}

// cpuUsed is the CPU time, in seconds, that process pid ("self", or a number)
// and the children it waited for have used; 0 once it has exited.
func cpuUsed(pid string) float64 {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ... utime stime cutime cstime, the 14th to 17th.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	var t float64
	for _, v := range f[11:15] {
		n, _ := strconv.ParseFloat(v, 64)
		t += n
	}
	return t / 100 // USER_HZ
}

// traceCPU samples, every interval until stop is closed, the CPU that the
// platform's processes running now other than its shims and instances (its
// daemons and components, which live through the pushes: a few reads of /proc
// per sample) use, and sends the cores they used in each interval.
func (p *platform) traceCPU(interval time.Duration, stop <-chan struct{}) <-chan []float64 {
	var pids []string
	for pid, name := range p.platformProcesses() {
		if name != "shims" && name != "apps" {
			pids = append(pids, strconv.Itoa(pid))
		}
	}
	total := func() float64 {
		var t float64
		for _, pid := range pids {
			t += cpuUsed(pid)
		}
		return t
	}
	trace := make(chan []float64, 1)
	go func() {
		var cores []float64
		last, at := total(), time.Now()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				trace <- cores
				return
			case <-tick.C:
				t, now := total(), time.Now()
				cores = append(cores, (t-last)/now.Sub(at).Seconds())
				last, at = t, now
			}
		}
	}()
	return trace
}

// side logs the names of the 8's t, the largest first, each with its mean for
// the 8 and for the single push (0 where it has none), in format; names whose
// both are 0 are left out.
func side(b testing.TB, format string, the8, single timings) {
	get := func(t timings, name string) float64 {
		if len(t[name]) == 0 {
			return 0
		}
		return t.mean(name)
	}
	names := make([]string, 0, len(the8))
	for name := range the8 {
		if get(the8, name) != 0 || get(single, name) != 0 {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(x, y int) bool { return get(the8, names[x]) > get(the8, names[y]) })
	for _, name := range names {
		b.Logf(format, name, get(the8, name), get(single, name))
	}
}

// apiStats is what the API server has done so far, from its metrics: the
// requests it answered (apiserver_request_total) by verb and resource as
// "n <verb> <resource>", the seconds they took (apiserver_request_duration_seconds,
// which leaves out watches) as "s <verb> <resource>", and in all as "requests";
// its requests to etcd by operation and type as "etcd n ..." and "etcd s ...";
// and its Go garbage collections as "gc-cycles".
func (p *platform) apiStats(b testing.TB) map[string]float64 {
	label := func(labels, name string) string {
		_, v, _ := strings.Cut(","+labels, ","+name+`="`)
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	request := func(labels string) string {
		key := label(labels, "verb") + " " + label(labels, "resource")
		if sub := label(labels, "subresource"); sub != "" {
			key += "/" + sub
		}
		return key
	}
	n := map[string]float64{}
	for _, line := range strings.Split(p.kubectl(b, "get", "--raw", "/metrics"), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok {
			name, rest, ok = strings.Cut(line, " ")
			if name == "go_gc_duration_seconds_count" {
				v, _ := strconv.ParseFloat(rest, 64)
				n["gc-cycles"] = v
			}
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue // a line of another form
		}
		switch name {
		case "apiserver_request_total":
			n["n "+request(labels)] += v
			n["requests"] += v
		case "apiserver_request_duration_seconds_sum":
			n["s "+request(labels)] += v
		case "etcd_request_duration_seconds_sum":
			n["etcd s "+label(labels, "operation")+" "+label(labels, "type")] += v
		case "etcd_request_duration_seconds_count":
			n["etcd n "+label(labels, "operation")+" "+label(labels, "type")] += v
		}
	}
	if n["requests"] == 0 {
		b.Fatal("the API server's metrics have no apiserver_request_total")
	}
	return n
}

// apiTable logs what the API server did for the 8 and for the single push, from
// apiStats: each kind of request (and of etcd request), the most frequent
// first, how many there were and how long each took on average.
func apiTable(b testing.TB, the8, single timings) {
	get := func(t timings, name string) float64 {
		if len(t[name]) == 0 {
			return 0
		}
		return t.mean(name)
	}
	b.Logf("API server: %.0f requests and %.0f garbage collections for the 8, %.0f and %.0f for one alone",
		get(the8, "requests"), get(the8, "gc-cycles"), get(single, "requests"), get(single, "gc-cycles"))
	b.Logf("%-62s %6s %6s %9s %9s", "request", "the 8", "single", "ms, the 8", "ms, single")
	for _, prefix := range []string{"n ", "etcd n "} {
		var keys []string
		for k := range the8 {
			if strings.HasPrefix(k, prefix) && get(the8, k) >= 0.5 {
				keys = append(keys, strings.TrimPrefix(k, prefix))
			}
		}
		sort.Slice(keys, func(x, y int) bool { return get(the8, prefix+keys[x]) > get(the8, prefix+keys[y]) })
		sums := strings.Replace(prefix, "n ", "s ", 1)
		for _, k := range keys {
			ms := func(t timings) float64 {
				if get(t, prefix+k) == 0 {
					return 0
				}
				return 1000 * get(t, sums+k) / get(t, prefix+k)
			}
			b.Logf("%-62s %6.0f %6.0f %9.1f %9.1f", strings.TrimSuffix(prefix, "n ")+k, get(the8, prefix+k), get(single, prefix+k), ms(the8), ms(single))
		}
	}
}

// since is each of now's CPU times less before's.
func since(now, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range now {
		d[k] = v - before[k]
	}
	return d
}

// mean is the mean of vs.
func mean(vs []float64) float64 {
	var s float64
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

// ticks is the machine's CPU time from /proc/stat's first line, in clock ticks:
// all of it, and the part idle or waiting for I/O.
type ticks struct{ total, idle uint64 }

func cpuTicks(b testing.TB) ticks {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	var t ticks
	for n, f := range strings.Fields(line)[1:9] { // guest time is counted in user already
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		t.total += v
		if n == 3 || n == 4 { // idle, iowait
			t.idle += v
		}
	}
	return t
}

// busySince is the share of the machine's CPU time since before that was not
// idle, 0 to 1: the platform's, the pushers' and whatever else runs.
func (t ticks) busySince(before ticks) float64 {
	return 1 - float64(t.idle-before.idle)/float64(t.total-before.total)
}
