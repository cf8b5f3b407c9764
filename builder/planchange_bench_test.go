package builder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/builder/plan"
	"bex.co/bex/internal/testenv"
)

// BenchmarkPlanAfterAOneLineChange measures what a push of a one-line change costs
// the Node and Python plans once their caches are warm, beside what the toolchain
// itself does on this machine to make the same files runnable, with its own cache
// warm: the floor. At each iteration the string the app answers with changes, and
// the app is built
//   - through bex (the commit exported, the plan generated, BuildKit with the
//     plan's cache mounts and bex's layer cache),
//   - on the host, in a directory with the same files: for Node `npm ci --offline`
//     (and `npm run build` if there is a build script) from a warm npm cache, for
//     Python `pip install -r requirements.txt` into a fresh directory with a warm
//     pip cache. That is what the plan's image build would do without a layer
//     cache.
//
// Both start warm (one build of the tree first, out of the timing), and they take
// turns at going first. Besides bex/<tool>, solve-ms/op and export-ms/op are the
// two halves of bex's build as "build done" logs them (BuildKit's solve with the
// image's export and unpack; the commit's files written out), and the steps'
// own times are logged.
func BenchmarkPlanAfterAOneLineChange(b *testing.B) {
	testenv.SharedStandIns(b)
	n := testenv.StandInsConfig().Names
	images := plan.Images{Go: n.Go, Node: n.Node, Python: n.Python, Runtime: n.Runtime, Stack: n.Stack, Ruby: n.Ruby, PHP: n.PHP, Composer: n.PHP, Static: testenv.BusyboxRef}
	// The builder logs each build's solve and export times to slog's default
	// logger, which it takes when it is made: a recorder in front of a handler of
	// its own keeps them (in front of slog's default handler, it would deadlock on
	// the log package's lock, which that handler writes through).
	done := &buildDone{}
	prev := slog.Default()
	slog.SetDefault(slog.New(&buildDoneHandler{Handler: slog.NewTextHandler(os.Stderr, nil), rec: done}))
	b.Cleanup(func() { slog.SetDefault(prev) })
	bldr, _ := newBuilder(b, func(c *builder.Config) { c.Plan.Images = images })

	for _, sample := range []struct {
		name, dir, stack string
		file, line, new  string // the file changed, the text replaced, its replacement (%d: the iteration)
		tool             string
		host             func(b *testing.B, dir string) (warm func(), run func() (time.Duration, map[string]time.Duration))
	}{
		{"node", "node-express", plan.StackNode,
			"server.js", "hello from node ${process.version}", "hello from node (change %d) ${process.version}",
			"npm", hostNpm},
		{"python", "python-wheels", plan.StackPython,
			"main.py", `f" as uid {os.getuid()}\n"`, `f" (change %d) as uid {os.getuid()}\n"`,
			"pip", hostPip},
	} {
		b.Run(sample.name, func(b *testing.B) {
			files := readTree(b, filepath.Join("plan", "testdata", sample.dir, "src"))
			if !strings.Contains(files[sample.file], sample.line) {
				b.Fatalf("%s does not answer with %s", sample.file, sample.line)
			}
			changed := func(i int) string {
				return strings.Replace(files[sample.file], sample.line, fmt.Sprintf(sample.new, i), 1)
			}
			r := newRepo(b, files)
			app := "bench-change-" + sample.name
			hostDir := b.TempDir()
			writeTree(b, hostDir, files)
			warmHost, runHost := sample.host(b, hostDir)

			steps := &stepTimes{}
			var lastImage string
			var solve, export time.Duration
			viaBex := func(record bool) time.Duration {
				var out strings.Builder
				req := r.request(app)
				done.reset()
				start := time.Now()
				res, err := bldr.Build(context.Background(), req, &out)
				took := time.Since(start)
				if err != nil {
					b.Fatalf("bex %s: %v\n%s", sample.name, err, out.String())
				}
				// The times compare only if bex built the plan, and built it again.
				if res.Stack != sample.stack {
					b.Fatalf("bex built %s as %q, want %q", sample.name, res.Stack, sample.stack)
				}
				if res.Image == lastImage {
					b.Fatalf("bex built the changed %s into the image it had before, %s:\n%s", sample.file, res.Image, out.String())
				}
				lastImage = res.Image
				s, e, ok := done.get(app)
				if !ok {
					b.Fatalf("bex logged no \"build done\" for %s", app)
				}
				if record {
					solve += s
					export += e
					steps.add(out.String())
				}
				return took
			}

			// Warm: each built the tree once, bex's layer and mount caches and
			// the toolchain's cache filled.
			viaBex(false)
			warmHost()
			runHost()
			var bex, host time.Duration
			parts := map[string]time.Duration{}
			viaHost := func() time.Duration {
				took, ps := runHost()
				for k, d := range ps {
					parts[k] += d
				}
				return took
			}
			for i := 1; b.Loop(); i++ {
				src := changed(i)
				r.commit(map[string]string{sample.file: src})
				writeTree(b, hostDir, map[string]string{sample.file: src})
				// On shared cores a neighbour's load falls on either, not always
				// on the same one.
				if i%2 == 1 {
					bex += viaBex(true)
					host += viaHost()
				} else {
					host += viaHost()
					bex += viaBex(true)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(bex.Milliseconds())/n, "bex-ms/op")
			b.ReportMetric(float64(host.Milliseconds())/n, sample.tool+"-ms/op")
			b.ReportMetric(float64(bex)/float64(host), "bex/"+sample.tool)
			b.ReportMetric(float64(solve.Milliseconds())/n, "solve-ms/op")
			b.ReportMetric(float64(export.Milliseconds())/n, "export-ms/op")
			for k, d := range parts {
				b.ReportMetric(float64(d.Milliseconds())/n, k+"-ms/op")
			}
			b.Logf("bex's steps, mean per change over %d:\n%s", b.N, steps.mean(b.N))
		})
	}
}

// hostNpm is npm's own warm build of the app in dir: npm ci from the lockfile,
// offline from a cache of its own, and npm run build if package.json has a build
// script.
func hostNpm(b *testing.B, dir string) (warm func(), run func() (time.Duration, map[string]time.Duration)) {
	npm := "/usr/bin/npm"
	data, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		b.Fatal(err)
	}
	var pkg struct {
		Scripts map[string]string `json:"scripts"`
	}
	if err := json.Unmarshal(data, &pkg); err != nil {
		b.Fatal(err)
	}
	env := append(os.Environ(), "npm_config_cache="+b.TempDir(), "npm_config_update_notifier=false")
	npmRun := func(args ...string) {
		b.Helper()
		cmd := exec.Command(npm, args...)
		cmd.Dir = dir
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The one build that reaches npm's registry: the cache is empty before it.
	warm = func() { npmRun("ci", "--no-audit", "--no-fund") }
	run = func() (time.Duration, map[string]time.Duration) {
		start := time.Now()
		npmRun("ci", "--offline", "--no-audit", "--no-fund")
		if _, ok := pkg.Scripts["build"]; ok {
			npmRun("run", "build")
		}
		return time.Since(start), nil
	}
	return warm, run
}

// hostPip is pip's own warm build of the app in dir: pip install -r
// requirements.txt into a fresh directory, with a warm cache of its own.
func hostPip(b *testing.B, dir string) (warm func(), run func() (time.Duration, map[string]time.Duration)) {
	python, err := exec.LookPath("python3")
	if err != nil {
		b.Fatal(err)
	}
	// The interpreter itself, not a shim in front of it (pyenv's is a shell script).
	exe, err := exec.Command(python, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		b.Fatalf("%s: %v", python, err)
	}
	python = strings.TrimSpace(string(exe))
	// The install alone, into a fresh directory, with the interpreter's own pip:
	// a fresh venv would add seconds of ensurepip that the image, whose base has
	// pip, never pays.
	target := filepath.Join(b.TempDir(), "site")
	// Debian's pip refuses to install into its Python's own site-packages
	// (PEP 668); this install goes into a directory of its own.
	env := append(os.Environ(), "PIP_CACHE_DIR="+b.TempDir(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1", "PIP_BREAK_SYSTEM_PACKAGES=1")
	if out, err := exec.Command(python, "-m", "pip", "--version").CombinedOutput(); err != nil {
		b.Fatalf("%s has no pip (make tools installs Debian's python3-pip): %v\n%s", python, err, out)
	}
	run = func() (time.Duration, map[string]time.Duration) {
		if err := os.RemoveAll(target); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		cmd := exec.Command(python, "-m", "pip", "install", "--target", target, "-r", "requirements.txt")
		cmd.Dir = dir
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("pip install: %v\n%s", err, out)
		}
		return time.Since(start), nil
	}
	// requirements.txt installs from the wheels committed with the app, with
	// --no-index: the cache has nothing to fetch, the first build warms it.
	return func() {}, run
}

// buildDone keeps the solve and export times of the builder's last "build done".
type buildDone struct {
	mu            sync.Mutex
	app           string
	solve, export time.Duration
}

func (d *buildDone) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.app, d.solve, d.export = "", 0, 0
}

func (d *buildDone) get(app string) (solve, export time.Duration, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.solve, d.export, d.app == app
}

// buildDoneHandler records "build done" in rec and hands each record on.
type buildDoneHandler struct {
	slog.Handler
	rec *buildDone
}

func (h *buildDoneHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "build done" {
		h.rec.mu.Lock()
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "app":
				h.rec.app = a.Value.String()
			case "solve":
				h.rec.solve = a.Value.Duration()
			case "export":
				h.rec.export = a.Value.Duration()
			}
			return true
		})
		h.rec.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *buildDoneHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &buildDoneHandler{Handler: h.Handler.WithAttrs(attrs), rec: h.rec}
}

func (h *buildDoneHandler) WithGroup(name string) slog.Handler {
	return &buildDoneHandler{Handler: h.Handler.WithGroup(name), rec: h.rec}
}

// stepTimes adds up the "done in" of each step of builds' output, by step.
type stepTimes struct {
	order []string
	total map[string]time.Duration
}

func (s *stepTimes) add(out string) {
	if s.total == nil {
		s.total = map[string]time.Duration{}
	}
	var step string
	for _, line := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(line, "-----> "); ok {
			step = name
			if strings.HasPrefix(name, "Built ") || strings.HasPrefix(name, "No Dockerfile") {
				step = ""
				continue
			}
			if _, seen := s.total[step]; !seen {
				s.order = append(s.order, step)
				s.total[step] = 0
			}
			continue
		}
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "done in "); ok && step != "" {
			if took, err := time.ParseDuration(d); err == nil {
				s.total[step] += took
			}
		}
	}
}

func (s *stepTimes) mean(n int) string {
	var w strings.Builder
	for _, step := range s.order {
		fmt.Fprintf(&w, "  %8s  %s\n", (s.total[step] / time.Duration(n)).Round(time.Millisecond), step)
	}
	return w.String()
}
