package deployer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	cimages "github.com/containerd/containerd/v2/core/images"

	"bex.co/bex/internal/testenv"
)

// diskRun is one sequence of deploys, measured at each count the benchmark
// reports: run once per test binary, whatever b.N (100 real rollouts take
// minutes; -benchtime 3x would triple them for the same numbers).
var diskRun struct {
	once  sync.Once
	kept  int64           // bytes of KeepReleases images alone: the baseline
	after map[int]int64   // bytes added after N deploys
	took  map[int]float64 // seconds per deploy up to N
	err   string
}

// BenchmarkDiskAfterDeploys measures the disk containerd uses (content and
// snapshots, blocks allocated, hard links once) after N = 10, 30 and 100
// deploys of one app with KeepReleases 5 on the real reconciler and local
// runtime, each deploy its own image (the busybox base plus 2 MiB of its own)
// and a real rollout, against the baseline measured in the same run: the bytes
// of 5 such images alone, imported and unpacked without running. ratio is
// used/kept: constant in N means nothing leaks; above 1 by the serving
// instance's copy of its image chowned into the app's ids (the base and the
// app's layer again) and its writable layer. Each count is measured settled
// (the drained instances gone, containerd's collection run).
func BenchmarkDiskAfterDeploys(b *testing.B) {
	counts := []int{10, 30, 100}
	diskRun.once.Do(func() { measureDeploys(b, counts) })
	if diskRun.err != "" {
		b.Fatal(diskRun.err)
	}
	for _, n := range counts {
		b.Run(fmt.Sprintf("deploys=%d", n), func(b *testing.B) {
			for b.Loop() {
			}
			b.ReportMetric(float64(diskRun.after[n])/(1<<20), "MiB-used")
			b.ReportMetric(float64(diskRun.kept)/(1<<20), "MiB-kept-images")
			b.ReportMetric(float64(diskRun.after[n])/float64(diskRun.kept), "ratio")
			b.ReportMetric(diskRun.took[n], "s/deploy")
			b.ReportMetric(0, "ns/op") // the loop measures nothing: the deploys ran once, above
		})
	}
}

func measureDeploys(b *testing.B, counts []int) {
	const keep, payload = 5, 2 << 20
	d := startDisk(b, "bench", keep, payload)
	ctx := context.Background()
	d.collect()
	base := rootBytes(b, d.cd.Root)

	// The baseline: KeepReleases images of the same make, alone.
	kept := newAppImages(b, d.cd, "bex.local/bench-kept", payload)
	for i := 1; i <= keep; i++ {
		kept.make(1000 + i)
	}
	d.collect()
	diskRun.kept = rootBytes(b, d.cd.Root) - base
	cl, err := d.cd.Client()
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	for _, n := range names(b, d.cd, testenv.Namespace, "bex.local/bench-kept:") {
		if err := cl.ImageService().Delete(ctx, n, cimages.SynchronousDelete()); err != nil {
			b.Fatal(err)
		}
	}

	diskRun.after, diskRun.took = map[int]int64{}, map[int]float64{}
	start := time.Now()
	last := counts[len(counts)-1]
	for i := 1; i <= last; i++ {
		d.deploy("bench", i)
		for _, n := range counts {
			if n == i {
				diskRun.took[n] = time.Now().Sub(start).Seconds() / float64(n)
				d.waitImages("bench", keep)
				d.settle("bench")
				diskRun.after[n] = rootBytes(b, d.cd.Root) - base
				b.Logf("after %d deploys: %.1f MiB used, %.1f MiB for %d images alone", n, float64(diskRun.after[n])/(1<<20), float64(diskRun.kept)/(1<<20), keep)
			}
		}
	}
}
