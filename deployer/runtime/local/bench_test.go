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
)

// BenchmarkRollout measures the time from the Sync of a new release until the
// endpoints name its instance (it takes traffic), and, in the same run, a raw
// containerd start of the same image until its first successful HTTP check. The
// ratio is the runtime's overhead over what containerd and the app need anyway.
func BenchmarkRollout(b *testing.B) {
	f := newFixture(b, fmt.Sprintf("bench-rollout-%d", benchRuns.Add(1)))
	f.cfg.Drain = 50 * time.Millisecond
	f.rt.Close()
	f.rt = f.newRuntime()
	ctx := context.Background()
	images := []string{f.v1, f.v2}
	release := int64(1)
	f.syncUntil(f.desired(release, images[0], 1), time.Minute, "first release", rolledOut)

	var rollout, raw time.Duration
	for i := 0; i < b.N; i++ {
		release++
		d := f.desired(release, images[int(release)%2], 1)
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
			time.Sleep(2 * time.Millisecond)
		}
		rollout += time.Since(start)
		b.StopTimer()
		f.syncUntil(d, time.Minute, "old release gone", rolledOut)
		raw += rawStart(b, f, images[int(release)%2], 29900)
		b.StartTimer()
	}
	b.StopTimer()
	r := float64(rollout.Microseconds()) / float64(b.N) / 1000
	c := float64(raw.Microseconds()) / float64(b.N) / 1000
	b.ReportMetric(r, "rollout-ms")
	b.ReportMetric(c, "raw-start-ms")
	b.ReportMetric(r/c, "ratio")
	b.ReportMetric(0, "ns/op")
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
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

var benchRuns atomic.Int32
