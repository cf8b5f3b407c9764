package local

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/internal/testenv"
)

// BenchmarkRollout measures the time from the Sync of a new release until the
// endpoints name its instance (it takes traffic), for instances in network
// namespaces of their own (the default) and, in the same run, for instances on
// the host's network (the cost of isolation: a namespace, CNI ADD and DEL per
// instance), and a raw containerd start of the same image until its first
// successful HTTP check. The ratio to the raw start is the runtime's overhead
// over what containerd and the app need anyway.
func BenchmarkRollout(b *testing.B) {
	tenant := newFixture(b, fmt.Sprintf("bench-rollout-%d", benchRuns.Add(1)))
	host := newFixture(b, fmt.Sprintf("bench-rollout-host-%d", benchRuns.Add(1)))
	host.cfg.Network = NetworkHost
	for _, f := range []*fixture{tenant, host} {
		f.cfg.Drain = 50 * time.Millisecond
		f.rt.Close()
		f.rt = f.newRuntime()
		f.syncUntil(f.desired(1, f.v1, 1), time.Minute, "first release", rolledOut)
	}
	release := int64(1)
	var rollout, rolloutHost, raw time.Duration
	for i := 0; i < b.N; i++ {
		release++
		b.StopTimer()
		waitPools(b, tenant)
		b.StartTimer()
		rollout += rolloutOnce(b, tenant, release)
		b.StopTimer()
		waitPools(b, tenant)
		b.StartTimer()
		rolloutHost += rolloutOnce(b, host, release)
		b.StopTimer()
		raw += rawStart(b, tenant, []string{tenant.v1, tenant.v2}[int(release)%2], 29900)
		b.StartTimer()
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) / 1000 }
	b.ReportMetric(ms(rollout), "rollout-ms")
	b.ReportMetric(ms(rolloutHost), "rollout-host-net-ms")
	b.ReportMetric(ms(raw), "raw-start-ms")
	b.ReportMetric(ms(rollout)/ms(raw), "ratio")
	b.ReportMetric(ms(rollout)/ms(rolloutHost), "netns/host-net")
	b.ReportMetric(0, "ns/op")
}

// rolloutOnce rolls out release on f and returns the time until it serves; the
// old release is gone when it returns (not counted).
func rolloutOnce(b *testing.B, f *fixture, release int64) time.Duration {
	b.Helper()
	ctx := context.Background()
	d := f.desired(release, []string{f.v1, f.v2}[int(release)%2], 1)
	start := time.Now()
	for {
		st, err := f.rt.Sync(ctx, d)
		if err != nil {
			b.Fatal(err)
		}
		if st.Failure != "" {
			b.Fatalf("release %d: %s", release, st.Message)
		}
		if st.Serving == release {
			break
		}
		time.Sleep(2 * time.Millisecond) // no wait: the poll that is measured, 2 ms its resolution
	}
	took := time.Since(start)
	b.StopTimer()
	f.syncUntil(d, time.Minute, "old release gone", rolledOut)
	// Stopped too (its namespace torn down), so that no stop overlaps the next
	// measurement.
	testenv.Eventually(b, 30*time.Second, "the old instance stopped", func() error {
		if n := len(f.instancesOf(f.key())); n != 1 {
			return fmt.Errorf("%d instances", n)
		}
		return nil
	})
	b.StartTimer()
	return took
}

// rawStart creates and starts a container of image directly in containerd, with
// PORT set, and polls it with HTTP GETs until one succeeds. It returns that time.
func rawStart(b *testing.B, f *fixture, image string, port int) time.Duration {
	b.Helper()
	cl, err := f.cd.Client()
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	img, err := f.rt.image(ctx, image) // name resolution is not what is measured
	if err != nil {
		b.Fatal(err)
	}
	img = containerd.NewImage(cl, img.Metadata())
	id := fmt.Sprintf("bench-raw-%d", time.Now().UnixNano())
	logPath := b.TempDir() + "/raw.log"
	start := time.Now()
	ctr, err := cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithEnv([]string{"PORT=" + strconv.Itoa(port)})))
	if err != nil {
		b.Fatal(err)
	}
	defer ctr.Delete(context.Background(), containerd.WithSnapshotCleanup)
	task, err := ctr.NewTask(ctx, cio.LogFile(logPath))
	if err != nil {
		b.Fatal(err)
	}
	defer task.Delete(context.Background(), containerd.WithProcessKill)
	if err := task.Start(ctx); err != nil {
		b.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("raw container never answered on %s: %v", url, err)
		}
		time.Sleep(2 * time.Millisecond) // no wait: the poll that is measured, 2 ms its resolution
	}
	return time.Since(start)
}

var benchRuns atomic.Int32

// waitPools waits until the namespace pool of every fixture's runtime is full, so
// that neither measurement shares the cores with the other's refill.
func waitPools(b *testing.B, fs ...*fixture) {
	b.Helper()
	for _, f := range fs {
		if f.rt.net.pool == nil {
			continue
		}
		testenv.Eventually(b, 30*time.Second, "the namespace pool refilled", func() error {
			if n := len(f.rt.net.pool); n != cap(f.rt.net.pool) {
				return fmt.Errorf("%d of %d", n, cap(f.rt.net.pool))
			}
			return nil
		})
	}
}
