package builder_test

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// BenchmarkBuild builds one sample app through bex (export of the commit from git,
// then BuildKit) and with buildctl from a checked-out copy of the same files, in the
// same iteration, cold (no cache) and warm (the same commit again), and reports both
// and their ratio. The goal is bex/buildctl <= 1.1, and a warm build under a second.
func BenchmarkBuild(b *testing.B) {
	bldr, bk := newBuilder(b)
	files := map[string]string{
		"Dockerfile": "FROM busybox\nCOPY deps.txt /deps.txt\nRUN cp /deps.txt /installed && echo built > /built\nCOPY . /app\nCMD [\"cat\", \"/built\"]\n",
		"deps.txt":   "dependency list\n",
		"app.txt":    "the app\n",
	}
	r := newRepo(b, files)
	buildctl, err := testenv.Binary("buildctl")
	if err != nil {
		b.Fatal(err)
	}
	viaBuildctl := func(noCache bool) time.Duration {
		args := []string{"--addr", bk.Address, "build", "--frontend", "dockerfile.v0",
			"--local", "context=" + r.dir, "--local", "dockerfile=" + r.dir,
			"--opt", "image-resolve-mode=local",
			"--output", "type=image,name=bex.local/bench-buildctl:1,unpack=true", "--progress", "quiet"}
		if noCache {
			args = append(args, "--no-cache")
		}
		start := time.Now()
		if out, err := exec.Command(buildctl, args...).CombinedOutput(); err != nil {
			b.Fatalf("buildctl: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	viaBex := func(noCache bool) time.Duration {
		req := r.request("bench")
		req.NoCache = noCache
		start := time.Now()
		if _, err := bldr.Build(context.Background(), req, io.Discard); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for _, mode := range []struct {
		name    string
		noCache bool
	}{{"cold", true}, {"warm", false}} {
		b.Run(mode.name, func(b *testing.B) {
			viaBex(false) // the warm runs start from a filled cache
			viaBuildctl(false)
			var bex, ctl time.Duration
			for b.Loop() {
				bex += viaBex(mode.noCache)
				ctl += viaBuildctl(mode.noCache)
			}
			n := float64(b.N)
			b.ReportMetric(bex.Seconds()/n, "bex-s/op")
			b.ReportMetric(ctl.Seconds()/n, "buildctl-s/op")
			b.ReportMetric(float64(bex)/float64(ctl), "bex/buildctl")
		})
	}
}
