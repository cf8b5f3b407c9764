package builder_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/internal/testenv"
)

// A buildkitd with bex up's GC policy and a small bound: builds that each leave 6
// MiB no image holds (a cache mount) make the cache grow past the bound (to 30 MiB;
// buildkitd's default policy would keep it all), and buildkitd's GC brings it back
// under the bound, least recently used first, without touching the layers the
// images hold: the latest commit's rebuild is fully cached.
func TestBuildCacheStaysUnderItsBoundAndARecentRebuildIsCached(t *testing.T) {
	const bound = 16 << 20
	testenv.SharedBusybox(t)
	bk, err := testenv.StartBuildkitd(t.TempDir(), testenv.SharedContainerd(t), testenv.WithBuildCache(bound, 24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bk.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := bk.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// buildkitd took the policy from its config: it reports it per worker.
	workers, err := cl.ListWorkers(ctx)
	if err != nil || len(workers) != 1 {
		t.Fatalf("workers: %v, %v", workers, err)
	}
	p := workers[0].GCPolicy
	if len(p) != 2 || p[0].KeepDuration != 24*time.Hour || p[1].MaxUsedSpace != bound || p[1].All {
		t.Fatalf("the worker's GC policy: %+v", p)
	}

	cfg := builder.DefaultConfig()
	cfg.StateDir, cfg.Address, cfg.ImageResolveMode = t.TempDir(), bk.Address, "local"
	b, err := builder.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each commit's RUN step fills a cache mount of its own with 6 MiB: cache
	// mounts are what no image holds (with the containerd worker, every layer an
	// image in containerd uses is "shared", and outside the bound: those bytes go
	// with the images).
	dockerfile := func(i int) string {
		return fmt.Sprintf("FROM busybox\nRUN --mount=type=cache,id=fill%d,target=/cache head -c 6291456 /dev/urandom > /cache/big && echo %d > /n\n", i, i)
	}
	r := newRepo(t, map[string]string{"Dockerfile": dockerfile(0)})
	const builds = 5
	for i := range builds {
		if i > 0 {
			r.commit(map[string]string{"Dockerfile": dockerfile(i)})
		}
		mustBuild(t, b, r.request("gc"))
	}
	// buildkitd runs its GC a second after a build, then at most once a minute, and
	// a pass skips records a build still held when it ran: wait for the unshared
	// cache (what the bound counts) to be back under it, asking for another pass
	// with a rebuild of the latest commit (a solve) now and then, as the next push
	// would.
	unshared := func() (int64, error) {
		du, err := cl.DiskUsage(ctx)
		if err != nil {
			return 0, err
		}
		var n int64
		for _, u := range du {
			if !u.Shared {
				n += u.Size
			}
		}
		return n, nil
	}
	asked := time.Now()
	testenv.Eventually(t, 200*time.Second, "the build cache under its bound", func() error {
		n, err := unshared()
		if err != nil {
			return err
		}
		if n > bound {
			if time.Since(asked) > 20*time.Second {
				mustBuild(t, b, r.request("gc"))
				asked = time.Now()
			}
			return fmt.Errorf("unshared build cache %d MiB, bound %d MiB", n>>20, bound>>20)
		}
		return nil
	})
	n, _ := unshared()
	t.Logf("unshared build cache after %d builds of %d MiB each: %d MiB (bound %d MiB)", builds, 6, n>>20, bound>>20)

	// The latest commit again: every step cached (FROM only looks the base up).
	_, out := mustBuild(t, b, r.request("gc"))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-----> [") && !strings.Contains(line, " FROM ") && !strings.HasSuffix(line, "CACHED") {
			t.Errorf("rebuild of the latest commit ran %q:\n%s", line, out)
		}
	}
}
