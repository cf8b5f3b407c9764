package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// BenchmarkIdleMemory measures the node's memory with bex installed and idle,
// before the other benchmarks push anything: every process of the node is in the
// cgroups under /sys/fs/cgroup/memory/bex-<id>/ (hack/clusterlocal puts the node's
// daemons in .../node and the kubelet its pods in .../pods). It reports the sum of
// the processes' VmRSS (a page shared by n processes counts n times), by daemon and by
// pod, and the cgroup's own count (memory.usage_in_bytes, which includes the page
// cache, and memory.stat's total_rss, the anonymous memory).
func BenchmarkIdleMemory(b *testing.B) {
	var shares map[string]float64
	var usage, rss float64
	for i := 0; i < b.N; i++ {
		shares, usage, rss = nodeMemory(b)
	}
	var names []string
	var sum float64
	for n, v := range shares {
		names = append(names, n)
		sum += v
	}
	sort.Strings(names)
	for _, n := range names {
		b.Logf("%-28s %7.1f MiB VmRSS", n, shares[n])
		b.ReportMetric(shares[n], "idle-"+n+"-MB")
	}
	b.Logf("%-28s %7.1f MiB VmRSS; the cgroup: %.1f MiB usage_in_bytes, %.1f MiB total_rss", "(sum)", sum, usage, rss)
	b.ReportMetric(sum, "node-idle-VmRSS-MB")
	b.ReportMetric(usage, "node-idle-cgroup-usage-MB")
	b.ReportMetric(rss, "node-idle-cgroup-rss-MB")
}

// BenchmarkPushToLive times warm pushes of the same app, one change at a time, to a
// `bex up` on this machine and to the cluster, alternately, in the same run: from
// the start of `git push` to the first HTTPS 200 with the change's page (the
// approach of cmd/bex/e2e's BenchmarkPushToLive), split by the arrival of the
// gitserver's lines. The change is a RUN step of hello-shell's Dockerfile, so that
// every push builds a new image. The goal: cluster/one-machine ≤ 2.
//
// The rollout on the real kubelet is timed from the arrival of the push's
// "Deploying release vN" line to the App's RolledOut condition True with vN serving
// (a kubectl watch of the App, started before the push).
func BenchmarkPushToLive(b *testing.B) {
	const app = "bench-push"
	// One key for both: the cluster's admin is the one machine's too, so that one
	// repository pushes to both remotes.
	m := startOneMachine(b, env["ADMIN_IDENTITY"])
	r := newRepo(b, "hello-shell", app)
	r.git(b, "remote", "add", "one", m.remote(app))
	oneAnswers := func(want string) func() error {
		return func() error {
			code, body, err := m.get(app, "/")
			if err == nil && (code != 200 || !strings.Contains(body, want)) {
				err = fmt.Errorf("%d %q", code, body)
			}
			return err
		}
	}
	hc := httpsClient(b)
	clusterAnswers := func(want string) func() error {
		return func() error {
			code, body, err := get(hc, app, "/")
			if err == nil && (code != 200 || !strings.Contains(body, want)) {
				err = fmt.Errorf("%d %q", code, body)
			}
			return err
		}
	}
	// Cold: the first push of the app to each.
	oneCold := timePushTo(b, r, "one", oneAnswers("hello from bex"), nil)
	clusterCold := timePushTo(b, r, "bex", clusterAnswers("hello from bex"), nil)
	b.Cleanup(func() {
		if out, _, err := bex("apps:destroy", app, "--confirm", app); err != nil {
			b.Logf("apps:destroy %s on the cluster: %v\n%s", app, err, out)
		}
	})

	var one, cl pushTimings
	for i := 0; i < b.N; i++ {
		body := fmt.Sprintf("change %d at %d", i, time.Now().UnixNano())
		r.commit(b, body, map[string]string{"Dockerfile": changedDockerfile(b, body)})
		one.add(timePushTo(b, r, "one", oneAnswers(body), nil))
		w := watchRollout(b, app)
		cl.add(timePushTo(b, r, "bex", clusterAnswers(body), w))
	}
	m.stop(b)
	one.report(b, "one-machine-warm")
	cl.report(b, "cluster-warm")
	for k, v := range oneCold {
		b.ReportMetric(v, "one-machine-cold-"+k+"-s")
	}
	for k, v := range clusterCold {
		b.ReportMetric(v, "cluster-cold-"+k+"-s")
	}
	ratio := cl.mean("total") / one.mean("total")
	b.ReportMetric(ratio, "cluster/one-machine-warm")
	b.Logf("warm push-to-live: one machine %.2f s, cluster %.2f s (%.2fx; goal ≤ 2); rollout on the kubelet %.2f s",
		one.mean("total"), cl.mean("total"), ratio, cl.mean("kubelet-rollout"))
}

// changedDockerfile is hello-shell's Dockerfile with its page saying body.
func changedDockerfile(b testing.TB, body string) string {
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join(root, "hack", "samples", "hello-shell", "Dockerfile"))
	if err != nil {
		b.Fatal(err)
	}
	changed := strings.Replace(string(df), "echo 'hello from bex'", "echo '"+body+"'", 1)
	if changed == string(df) {
		b.Fatal("hello-shell's Dockerfile no longer echoes 'hello from bex'")
	}
	return changed
}

// pushTimings collects named durations, in seconds, over iterations.
type pushTimings map[string][]float64

func (t *pushTimings) add(m map[string]float64) {
	if *t == nil {
		*t = pushTimings{}
	}
	for k, v := range m {
		(*t)[k] = append((*t)[k], v)
	}
}

func (t pushTimings) mean(k string) float64 {
	var s float64
	for _, v := range t[k] {
		s += v
	}
	return s / float64(len(t[k]))
}

func (t pushTimings) report(b *testing.B, prefix string) {
	for k := range t {
		b.ReportMetric(t.mean(k), prefix+"-"+k+"-s")
	}
}

// rolloutWatch is a kubectl watch of one App: the time each RolledOut message
// arrived.
type rolloutWatch struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	seen   []rolloutEvent
	stderr testenv.SyncBuffer
	done   chan struct{}
}

type rolloutEvent struct {
	at      time.Time
	message string
}

// watchRollout starts `kubectl get app APP --watch` printing, for each version of
// the App, what says whether its RolledOut condition is True for its current release.
func watchRollout(b testing.TB, app string) *rolloutWatch {
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		b.Fatal(err)
	}
	w := &rolloutWatch{done: make(chan struct{})}
	w.cmd = exec.Command(bin, "--kubeconfig", env["KUBECONFIG"], "get", "app", app, "--watch", "-o",
		// A filter of the conditions ([?(@.type=="RolledOut")]) ends kubectl's watch
		// after its first line (kubectl v1.37, with no error): the phase is derived
		// from RolledOut (Running is RolledOut True), observedGeneration says it is
		// about the App's current spec, and revision is the release that serves.
		`jsonpath={.metadata.generation} {.status.observedGeneration} {.status.phase} {.status.revision}{"\n"}`)
	w.cmd.Stderr = &w.stderr
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.mu.Lock()
			w.seen = append(w.seen, rolloutEvent{time.Now(), sc.Text()})
			w.mu.Unlock()
		}
	}()
	// The watch's first line is the App as it is: from then on every change arrives.
	for deadline := time.Now().Add(30 * time.Second); ; {
		w.mu.Lock()
		n := len(w.seen)
		w.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("kubectl get app %s --watch printed nothing in 30 s", app)
		}
		time.Sleep(5 * time.Millisecond) // no wait: the poll for the watch's first line
	}
	return w
}

// servedAt is when the watch first saw the App rolled out (phase Running, for its
// current generation) with release n serving, or false.
func (w *rolloutWatch) servedAt(n int64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.seen {
		if f := strings.Fields(e.message); len(f) == 4 && f[0] == f[1] && f[2] == "Running" && f[3] == strconv.FormatInt(n, 10) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

func (w *rolloutWatch) stop() {
	_ = w.cmd.Process.Kill() // by its PID: the watch never ends by itself
	<-w.done
	_ = w.cmd.Wait()
}

// timePushTo pushes r's main to remote and returns when answers passes: the total
// and the split by the arrival of the gitserver's lines (receive: to "Building";
// build: to "Built"; release: to "Deploying release"; deploy: to "Application
// deployed"; route: to the first 200). With a watch, also kubelet-rollout: from
// "Deploying release vN" to the App's RolledOut condition saying vN serves.
func timePushTo(b testing.TB, r *repo, remote string, answers func() error, w *rolloutWatch) map[string]float64 {
	if w != nil {
		defer w.stop()
	}
	cmd := exec.Command("git", "push", remote, "main")
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
	var release int64
	var out strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		for mark, prefix := range map[string]string{"received": "-----> Building", "built": "-----> Built", "deploying": "-----> Deploying release v", "deployed": "-----> Application deployed"} {
			if _, seen := marks[mark]; !seen && strings.Contains(line, prefix) {
				marks[mark] = time.Since(start)
				if mark == "deploying" {
					_, after, _ := strings.Cut(line, prefix)
					release, _ = strconv.ParseInt(strings.Fields(after)[0], 10, 64)
				}
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("push to %s: %v\n%s", remote, err, out.String())
	}
	for {
		err := answers()
		if err == nil {
			break
		}
		if time.Since(start) > 2*time.Minute {
			b.Fatalf("the app did not answer within 2 minutes of the push to %s: %v\n%s", remote, err, out.String())
		}
		time.Sleep(5 * time.Millisecond) // no wait: the poll that is measured, 5 ms its resolution
	}
	live := time.Since(start)
	if len(marks) != 4 {
		b.Fatalf("push output lacks a step (%v):\n%s", marks, out.String())
	}
	t := map[string]float64{
		"total":   live.Seconds(),
		"receive": marks["received"].Seconds(),
		"build":   (marks["built"] - marks["received"]).Seconds(),
		"release": (marks["deploying"] - marks["built"]).Seconds(),
		"deploy":  (marks["deployed"] - marks["deploying"]).Seconds(),
		"route":   (live - marks["deployed"]).Seconds(),
	}
	if w != nil {
		var at time.Time
		for deadline := time.Now().Add(time.Minute); ; {
			var ok bool
			if at, ok = w.servedAt(release); ok {
				break
			}
			if time.Now().After(deadline) {
				w.mu.Lock()
				b.Fatalf("the App's RolledOut condition never said v%d serves; the watch saw %v; kubectl said %s", release, w.seen, w.stderr.String())
			}
			time.Sleep(5 * time.Millisecond) // no wait: the poll for the watch's line
		}
		t["kubelet-rollout"] = at.Sub(start.Add(marks["deploying"])).Seconds()
	}
	return t
}

// nodeMemory sums VmRSS over every process in the node's cgroups, by daemon (the
// processes of .../node, by command name; the shims as one) and by pod (by its
// app.kubernetes.io/name, k8s-app or app.bex.co/app label, or its name), and reads
// the cgroup's usage_in_bytes and total_rss; all in MiB.
func nodeMemory(b testing.TB) (map[string]float64, float64, float64) {
	dir := filepath.Dir(env["KUBECONFIG"])
	pid, err := os.ReadFile(filepath.Join(dir, "node.pid"))
	if err != nil {
		b.Fatalf("the node's pid (hack/clusterlocal's node.pid beside the kubeconfig): %v", err)
	}
	cg, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/cgroup")
	if err != nil {
		b.Fatal(err)
	}
	var top string
	for _, l := range strings.Split(string(cg), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[1] == "memory" {
			top = "/" + strings.Split(strings.TrimPrefix(f[2], "/"), "/")[0]
		}
	}
	if top == "" || !strings.HasPrefix(top, "/bex-") {
		b.Fatalf("the node's memory cgroup is %q, want /bex-<id>/...", top)
	}
	root := filepath.Join("/sys/fs/cgroup/memory", top)

	pods := map[string]string{} // uid → share
	for _, l := range strings.Split(kubectl(b, "get", "pods", "-A", "-o",
		`jsonpath={range .items[*]}{.metadata.uid} {.metadata.namespace}/{.metadata.name} {.metadata.labels.app\.kubernetes\.io/name}{.metadata.labels.k8s-app}{.metadata.labels.app\.bex\.co/app}{"\n"}{end}`), "\n") {
		f := strings.Fields(l)
		switch len(f) {
		case 2:
			pods[f[0]] = "pod-" + strings.ReplaceAll(f[1], "/", "-")
		case 3:
			pods[f[0]] = "pod-" + f[2]
		}
	}
	shares := map[string]float64{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return err
		}
		procs, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		share := ""
		for _, part := range strings.Split(path, "/") {
			if uid, ok := strings.CutPrefix(part, "pod"); ok && len(uid) == 36 {
				share = pods[strings.ReplaceAll(uid, "_", "-")]
				if share == "" {
					share = "pod-" + uid
				}
			}
		}
		for _, p := range strings.Fields(string(procs)) {
			status, err := os.ReadFile("/proc/" + p + "/status")
			if err != nil {
				continue // exited meanwhile
			}
			name := share
			var kb float64
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
					kb, _ = strconv.ParseFloat(strings.Fields(v)[0], 64)
				}
				if v, ok := strings.CutPrefix(l, "Name:"); ok && name == "" {
					name = strings.TrimSpace(v)
					if strings.HasPrefix(name, "containerd-shim") {
						name = "containerd-shims"
					}
				}
			}
			shares[name] += kb / 1024
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if len(shares) == 0 {
		b.Fatalf("no process in %s", root)
	}
	usage, err := os.ReadFile(filepath.Join(root, "memory.usage_in_bytes"))
	if err != nil {
		b.Fatal(err)
	}
	u, _ := strconv.ParseFloat(strings.TrimSpace(string(usage)), 64)
	stat, err := os.ReadFile(filepath.Join(root, "memory.stat"))
	if err != nil {
		b.Fatal(err)
	}
	var rss float64
	for _, l := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(l, "total_rss "); ok {
			rss, _ = strconv.ParseFloat(v, 64)
		}
	}
	return shares, u / (1 << 20), rss / (1 << 20)
}
