package builder_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/builder/plan"
	"bex.co/bex/internal/testenv"
)

// BenchmarkPlanBuilds builds each plan's sample (builder/plan/testdata, the apps
// run_test.go builds and serves) zero-config through bex (the commit exported from
// git, the plan detected, its Dockerfile generated, then BuildKit) and, in the same
// iteration, with buildctl as `docker build` would: the same generated Dockerfile
// in a directory of its own, and a plain copy of the same files as the context. Cold
// is --no-cache on both, warm the same commit (the same files) again. The plans'
// bases are the Debian stand-ins (internal/machine/baseimage), resolved locally. The goal
// is bex/buildctl <= 1.0 warm.
func BenchmarkPlanBuilds(b *testing.B) {
	testenv.SharedStandIns(b)
	n := testenv.StandInsConfig().Names
	images := plan.Images{Go: n.Go, Node: n.Node, Python: n.Python, Runtime: n.Runtime, Stack: n.Stack, Ruby: n.Ruby, PHP: n.PHP, Composer: n.PHP, Static: testenv.BusyboxRef}
	bldr, bk := newBuilder(b, func(c *builder.Config) { c.Plan.Images = images })
	buildctl, err := testenv.Binary("buildctl")
	if err != nil {
		b.Fatal(err)
	}
	for _, sample := range []struct{ name, stack string }{
		// A module dependency (github.com/google/uuid) through the Go module proxy.
		{"go-module", plan.StackGo},
		// express from npm's registry, installed by npm ci from package-lock.json.
		{"node-express", plan.StackNode},
		// A wheel committed with the app (PyPI is not reachable here).
		{"python-wheels", plan.StackPython},
	} {
		files := readTree(b, filepath.Join("plan", "testdata", sample.name, "src"))
		r := newRepo(b, files)
		req := r.request("bench-" + sample.name)

		// buildctl's inputs: the files as a checkout would have them, and the
		// Dockerfile the plan generates for them with bex's own plan settings.
		ctxDir := b.TempDir()
		writeTree(b, ctxDir, files)
		cfg := plan.Config{Images: images}
		p, err := plan.Detect(os.DirFS(ctxDir), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if p.Stack != sample.stack {
			b.Fatalf("%s: stack %q, want %q", sample.name, p.Stack, sample.stack)
		}
		dfDir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), []byte(p.Dockerfile), 0o644); err != nil {
			b.Fatal(err)
		}

		viaBuildctl := func(noCache bool) time.Duration {
			args := []string{"--addr", bk.Address, "build", "--frontend", "dockerfile.v0",
				"--local", "context=" + ctxDir, "--local", "dockerfile=" + dfDir,
				"--opt", "image-resolve-mode=local",
				"--output", "type=image,name=bex.local/bench-buildctl-" + sample.name + ":1,unpack=true", "--progress", "quiet"}
			if noCache {
				args = append(args, "--no-cache")
			}
			start := time.Now()
			if out, err := exec.Command(buildctl, args...).CombinedOutput(); err != nil {
				b.Fatalf("buildctl %s: %v\n%s\nDockerfile:\n%s", sample.name, err, out, p.Dockerfile)
			}
			return time.Since(start)
		}
		viaBex := func(noCache bool) time.Duration {
			req := req
			req.NoCache = noCache
			var out strings.Builder
			start := time.Now()
			res, err := bldr.Build(context.Background(), req, &out)
			took := time.Since(start)
			if err != nil {
				b.Fatalf("bex %s: %v\n%s", sample.name, err, out.String())
			}
			// The comparison holds only if bex built what buildctl builds.
			if res.Stack != sample.stack {
				b.Fatalf("bex built %s as %q, want %q", sample.name, res.Stack, sample.stack)
			}
			return took
		}
		for _, mode := range []struct {
			name    string
			noCache bool
		}{{"cold", true}, {"warm", false}} {
			b.Run(sample.name+"/"+mode.name, func(b *testing.B) {
				// Both start from a filled cache: the warm runs measure a
				// build of nothing new, the cold ones lose nothing to a first
				// unpack of the bases.
				viaBex(false)
				viaBuildctl(false)
				// The two take turns at going first: on shared cores, a
				// neighbour's load falls on one of them, not always the same.
				var bex, ctl time.Duration
				for i := 0; b.Loop(); i++ {
					if i%2 == 0 {
						bex += viaBex(mode.noCache)
						ctl += viaBuildctl(mode.noCache)
					} else {
						ctl += viaBuildctl(mode.noCache)
						bex += viaBex(mode.noCache)
					}
				}
				n := float64(b.N)
				b.ReportMetric(float64(bex.Milliseconds())/n, "bex-ms/op")
				b.ReportMetric(float64(ctl.Milliseconds())/n, "buildctl-ms/op")
				b.ReportMetric(float64(bex)/float64(ctl), "bex/buildctl")
			})
		}
	}
}

// readTree reads the regular files below dir, by their slash-separated paths.
func readTree(t testing.TB, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		files[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no files below %s", dir)
	}
	return files
}

// writeTree writes files below dir.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkGoPlanAfterAOneLineChange measures what a push of a one-line change to a
// Go app costs once its cache is warm: the string main.go answers with changes at
// each iteration, and the app is built
//   - through bex, with the Go plan's cache mounts (build and module caches),
//   - with buildctl, from the same plan without its cache mounts (the plan as it
//     was before them: each build compiles the dependencies and the standard
//     library again),
//   - with `go build` on this machine, with a warm build cache, as a developer
//     would between two edits: the floor.
//
// All three start warm (one build of the tree first).
func BenchmarkGoPlanAfterAOneLineChange(b *testing.B) {
	testenv.SharedStandIns(b)
	n := testenv.StandInsConfig().Names
	images := plan.Images{Go: n.Go, Node: n.Node, Python: n.Python, Runtime: n.Runtime, Stack: n.Stack, Ruby: n.Ruby, PHP: n.PHP, Composer: n.PHP, Static: testenv.BusyboxRef}
	bldr, bk := newBuilder(b, func(c *builder.Config) { c.Plan.Images = images })
	buildctl, err := testenv.Binary("buildctl")
	if err != nil {
		b.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		b.Fatal(err)
	}
	files := readTree(b, filepath.Join("plan", "testdata", "go-module", "src"))
	const line = "hello from go as uid"
	if !strings.Contains(files["main.go"], line) {
		b.Fatalf("main.go does not answer %q", line)
	}
	changed := func(i int) string {
		return strings.Replace(files["main.go"], line, fmt.Sprintf("hello from go (change %d) as uid", i), 1)
	}
	r := newRepo(b, files)
	req := r.request("bench-go-change")

	ctxDir, hostDir, dfDir := b.TempDir(), b.TempDir(), b.TempDir()
	writeTree(b, ctxDir, files)
	writeTree(b, hostDir, files)
	p, err := plan.Detect(os.DirFS(ctxDir), plan.Config{Images: images})
	if err != nil {
		b.Fatal(err)
	}
	noMounts := regexp.MustCompile(`--mount=type=cache,target=\S+ (\\\n\s*)?`).ReplaceAllString(p.Dockerfile, "")
	if noMounts == p.Dockerfile || strings.Contains(noMounts, "--mount") {
		b.Fatalf("the plan's cache mounts were not taken out:\n%s", noMounts)
	}
	if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), []byte(noMounts), 0o644); err != nil {
		b.Fatal(err)
	}
	goCache := b.TempDir()

	viaBex := func() time.Duration {
		var out strings.Builder
		req := r.request(req.App)
		start := time.Now()
		_, err := bldr.Build(context.Background(), req, &out)
		took := time.Since(start)
		if err != nil {
			b.Fatalf("bex: %v\n%s", err, out.String())
		}
		return took
	}
	viaBuildctl := func() time.Duration {
		start := time.Now()
		out, err := exec.Command(buildctl, "--addr", bk.Address, "build", "--frontend", "dockerfile.v0",
			"--local", "context="+ctxDir, "--local", "dockerfile="+dfDir, "--opt", "image-resolve-mode=local",
			"--output", "type=image,name=bex.local/bench-go-nomounts:1,unpack=true", "--progress", "quiet").CombinedOutput()
		if err != nil {
			b.Fatalf("buildctl: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	viaGo := func() time.Duration {
		cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(hostDir, "app"), ".")
		cmd.Dir = hostDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOCACHE="+goCache, "GOFLAGS=-buildvcs=false", "GOTOOLCHAIN=local")
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	// Warm: each built the tree once.
	viaBex()
	viaBuildctl()
	viaGo()
	var bex, ctl, host time.Duration
	for i := 1; b.Loop(); i++ {
		src := changed(i)
		r.commit(map[string]string{"main.go": src})
		writeTree(b, ctxDir, map[string]string{"main.go": src})
		writeTree(b, hostDir, map[string]string{"main.go": src})
		bex += viaBex()
		ctl += viaBuildctl()
		host += viaGo()
	}
	n2 := float64(b.N)
	b.ReportMetric(float64(bex.Milliseconds())/n2, "bex-ms/op")
	b.ReportMetric(float64(ctl.Milliseconds())/n2, "nomounts-ms/op")
	b.ReportMetric(float64(host.Milliseconds())/n2, "gobuild-ms/op")
	b.ReportMetric(float64(bex)/float64(host), "bex/gobuild")
}
