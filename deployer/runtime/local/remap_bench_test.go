package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	bkclient "github.com/moby/buildkit/client"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/tonistiigi/fsutil"

	"bex.co/bex/internal/testenv"
)

// bigDockerfile is an image the size of a middling app: 150 MB in one file and
// 20,000 files of 1.3 kB (node_modules-like), on busybox.
const bigDockerfile = `FROM busybox
RUN mkdir /tree && cd /tree && dd if=/dev/urandom of=blob bs=1000000 count=150 && \
    s=0123456789 && for k in 1 2 3 4 5 6 7; do s=$s$s; done && \
    i=0 && while [ $i -lt 20000 ]; do echo $s > f$i; i=$((i+1)); done
`

// BenchmarkRemappedSnapshot measures what an instance's user namespace costs at
// creation: the first container of an image for an app's uid range chowns a view
// of the image into a snapshot of its own (remap-ms with containerd's
// WithUserNSRemappedSnapshot; remap-MB, the disk that snapshot takes); later ones of the same image and range start from that snapshot
// (cached-ms), as a container without a user namespace does from the image
// (plain-ms). Each iteration takes a fresh range, so each pays the first cost.
// (A volatile overlay for the chown, synced once, was tried: no faster here; the
// cost is the copy-up of every file's data, not its fsync.)
func BenchmarkRemappedSnapshot(b *testing.B) {
	for _, tc := range []struct{ name, dockerfile string }{
		{"busybox", "FROM busybox\n"},
		{"big", bigDockerfile},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cd := testenv.SharedContainerd(b)
			ref := buildBenchImage(b, tc.name, tc.dockerfile)
			cl, err := cd.Client()
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			img, err := cl.GetImage(ctx, ref)
			if err != nil {
				b.Fatal(err)
			}
			if err := img.Unpack(ctx, "overlayfs"); err != nil {
				b.Fatal(err)
			}
			var remap, cached, plain time.Duration
			var remapBytes int64
			for i := 0; i < b.N; i++ {
				m := idmap{host: 1<<31 + uint32(benchRuns.Add(1))*IDRangeSize, size: IDRangeSize}
				id := fmt.Sprintf("bench-remap-%d", time.Now().UnixNano())
				start := time.Now()
				c1, err := cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithSnapshotter("overlayfs"),
					containerd.WithUserNSRemappedSnapshot(id, img, m.mappings(), m.mappings()), containerd.WithNewSpec())
				if err != nil {
					b.Fatal(err)
				}
				remap += time.Since(start)
				start = time.Now()
				c2, err := cl.NewContainer(ctx, id+"-2", containerd.WithImage(img), containerd.WithSnapshotter("overlayfs"),
					containerd.WithUserNSRemappedSnapshot(id+"-2", img, m.mappings(), m.mappings()), containerd.WithNewSpec())
				if err != nil {
					b.Fatal(err)
				}
				cached += time.Since(start)
				start = time.Now()
				c3, err := cl.NewContainer(ctx, id+"-3", containerd.WithImage(img), containerd.WithSnapshotter("overlayfs"),
					containerd.WithNewSnapshot(id+"-3", img), containerd.WithNewSpec())
				if err != nil {
					b.Fatal(err)
				}
				plain += time.Since(start)
				key, err := remappedKey(img, m)
				if err != nil {
					b.Fatal(err)
				}
				u, err := cl.SnapshotService("overlayfs").Usage(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				remapBytes += u.Size
				for _, c := range []containerd.Container{c1, c2, c3} {
					if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
						b.Fatal(err)
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(remap.Milliseconds())/n, "remap-ms")
			b.ReportMetric(float64(remapBytes)/n/1e6, "remap-MB")
			b.ReportMetric(float64(cached.Milliseconds())/n, "cached-ms")
			b.ReportMetric(float64(plain.Milliseconds())/n, "plain-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func buildBenchImage(b *testing.B, name, dockerfile string) string {
	b.Helper()
	bk := testenv.SharedBuildkitd(b)
	testenv.SharedBusybox(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		b.Fatal(err)
	}
	c, err := bk.Client(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fs, err := fsutil.NewFS(dir)
	if err != nil {
		b.Fatal(err)
	}
	ch := make(chan *bkclient.SolveStatus)
	go func() {
		for range ch {
		}
	}()
	ref := "docker.io/library/bex-remap-bench:" + strings.ToLower(name)
	if _, err := c.Solve(ctx, nil, bkclient.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: map[string]string{"filename": "Dockerfile", "image-resolve-mode": "local"},
		LocalMounts:   map[string]fsutil.FS{"context": fs, "dockerfile": fs},
		Exports: []bkclient.ExportEntry{{Type: bkclient.ExporterImage,
			Attrs: map[string]string{"name": ref, "unpack": "true"}}},
	}, ch); err != nil {
		b.Fatal(err)
	}
	return ref
}

// remappedKey is the key containerd's client gives the remapped view of img for
// m: the digest of {Parent, IDMap} as client.remappedSnapshot marshals it.
func remappedKey(img containerd.Image, m idmap) (string, error) {
	diffIDs, err := img.RootFS(context.Background())
	if err != nil {
		return "", err
	}
	type idMap struct {
		UidMap []specs.LinuxIDMapping `json:"UidMap"` //nolint:revive // containerd's field names
		GidMap []specs.LinuxIDMapping `json:"GidMap"`
	}
	data, err := json.Marshal(struct {
		Parent string `json:"Parent"`
		IDMap  idMap  `json:"IDMap"`
	}{identity.ChainID(diffIDs).String(), idMap{m.mappings(), m.mappings()}})
	if err != nil {
		return "", err
	}
	return digest.FromBytes(data).String(), nil
}
