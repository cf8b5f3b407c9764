package testenv_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// BenchmarkDaemonStartup measures how long the harness takes to bring up each daemon
// until it answers (containerd: Version; buildkitd: a listed worker; control plane:
// CRDs served; Pebble: its directory), then all of them at once. The baseline is the
// same daemons started one after another in the same iteration, so the "together"
// figure is reported as a ratio to it (below 1 means the parallel start pays off).
func BenchmarkDaemonStartup(b *testing.B) {
	type daemon struct {
		name  string
		start func(dir string) (stop func() error, err error)
	}
	startContainerd := func(dir string) (func() error, error) {
		c, err := testenv.StartContainerd(dir)
		if err != nil {
			return nil, err
		}
		return c.Stop, nil
	}
	// buildkitd needs a containerd; its own figure is measured with one already up.
	startBuildkitdOnly := func(c *testenv.Containerd) func(dir string) (func() error, error) {
		return func(dir string) (func() error, error) {
			bk, err := testenv.StartBuildkitd(dir, c)
			if err != nil {
				return nil, err
			}
			return bk.Stop, nil
		}
	}
	startControlPlane := func(dir string) (func() error, error) {
		cp, err := testenv.StartControlPlane(dir)
		if err != nil {
			return nil, err
		}
		return cp.Stop, nil
	}
	startPebble := func(dir string) (func() error, error) {
		p, err := testenv.StartPebble(dir)
		if err != nil {
			return nil, err
		}
		return p.Stop, nil
	}

	measure := func(b *testing.B, start func(dir string) (func() error, error)) time.Duration {
		b.Helper()
		dir, err := os.MkdirTemp("", "bex-bench-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		t0 := time.Now()
		stop, err := start(dir)
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		return d
	}

	for _, d := range []daemon{
		{"containerd", startContainerd},
		{"controlplane", startControlPlane},
		{"pebble", startPebble},
	} {
		b.Run(d.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				total += measure(b, d.start)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/start")
		})
	}
	b.Run("buildkitd", func(b *testing.B) {
		dir := b.TempDir()
		c, err := testenv.StartContainerd(filepath.Join(dir, "containerd"))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Stop()
		var total time.Duration
		for b.Loop() {
			total += measure(b, startBuildkitdOnly(c))
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/start")
	})

	// all: containerd then buildkitd, beside the control plane and Pebble.
	startAll := func(parallel bool) func(dir string) (func() error, error) {
		return func(dir string) (func() error, error) {
			var (
				mu    sync.Mutex
				stops []func() error
				errs  []error
			)
			add := func(stop func() error, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else {
					stops = append(stops, stop)
				}
			}
			chains := []func(){
				func() {
					c, err := testenv.StartContainerd(filepath.Join(dir, "containerd"))
					if err != nil {
						add(nil, err)
						return
					}
					add(c.Stop, nil)
					add(startBuildkitdOnly(c)(filepath.Join(dir, "buildkitd")))
				},
				func() { add(startControlPlane(filepath.Join(dir, "controlplane"))) },
				func() { add(startPebble(filepath.Join(dir, "pebble"))) },
			}
			var wg sync.WaitGroup
			for _, chain := range chains {
				if parallel {
					wg.Go(chain)
				} else {
					chain()
				}
			}
			wg.Wait()
			stopAll := func() error {
				for i := len(stops) - 1; i >= 0; i-- {
					if err := stops[i](); err != nil {
						return err
					}
				}
				return nil
			}
			if len(errs) > 0 {
				_ = stopAll()
				return nil, errs[0]
			}
			return stopAll, nil
		}
	}
	b.Run("all", func(b *testing.B) {
		var sequential, together time.Duration
		for b.Loop() {
			sequential += measure(b, startAll(false))
			together += measure(b, startAll(true))
		}
		n := float64(b.N)
		b.ReportMetric(float64(sequential.Milliseconds())/n, "ms/sequential")
		b.ReportMetric(float64(together.Milliseconds())/n, "ms/together")
		b.ReportMetric(float64(together)/float64(sequential), "together/sequential")
	})
}
