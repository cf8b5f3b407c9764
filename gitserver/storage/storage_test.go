package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bex.co/bex/internal/diskuse"
)

type fakeBuilds struct{ recs []diskuse.CacheRecord }

func (fakeBuilds) LogBytes(string) (int64, error) { return 0, nil }
func (f fakeBuilds) CacheUsage(context.Context) ([]diskuse.CacheRecord, error) {
	return f.recs, nil
}
func (f fakeBuilds) PruneCache(context.Context, bool) ([]diskuse.CacheRecord, error) {
	return nil, nil
}

type fakeImages struct {
	u    *diskuse.ImageUsage
	root string
}

func (f fakeImages) Usage(context.Context, string, map[string][]string) (*diskuse.ImageUsage, error) {
	return f.u, nil
}
func (fakeImages) Remove(context.Context, string, string, []diskuse.ReclaimableImage, []string) ([]diskuse.ReclaimableImage, error) {
	return nil, nil
}
func (fakeImages) CollectGarbage(context.Context) error { return nil }
func (f fakeImages) ContentRoot(context.Context) string { return f.root }
func (fakeImages) Close() error                         { return nil }

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		dir, path string
		want      bool
	}{
		{"/var/lib/bex", "/var/lib/bex", true},
		{"/var/lib/bex", "/var/lib/bex/containerd/root", true},
		{"/var/lib/bex", "/var/lib/bexx", false},
		{"/var/lib/bex", "/var/lib", false},
		{"/var/lib/bex", "", false},
	} {
		if got := within(c.dir, c.path); got != c.want {
			t.Errorf("within(%q, %q) = %v, want %v", c.dir, c.path, got, c.want)
		}
	}
}

// The platform's row of a machine without apps: a base image is the
// platform's images; a Shared record found through its lease counts its own
// snapshot (its size less the image's blob), reclaimable only with the blob;
// one whose lease is unknown is shown apart; the rest of the state dir is other, and the rows add up.
func TestUsageJoinsTheImagesAndTheBuildCache(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "etcd"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	u := &diskuse.ImageUsage{
		Shared:     diskuse.ImageBytes{Bytes: 500},
		Blobs:      map[string]diskuse.Blob{"sha256:b": {Size: 300}},
		LeaseBlobs: map[string][]string{"rec1": {"sha256:b"}},
	}
	m := &Machine{StateDir: state, Repos: nil,
		Builds: fakeBuilds{recs: []diskuse.CacheRecord{
			{ID: "rec1", Size: 340, Shared: true},
			{ID: "rec2", Size: 70, Shared: true},
			{ID: "rec3", Size: 20, Reclaimable: true},
		}},
		OpenImages: func() (ImageStore, error) { return fakeImages{u: u, root: "/elsewhere"}, nil },
		ImagesAt:   "/run/containerd.sock",
	}
	du, err := m.Usage(context.Background(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	p := du.Platform
	if p.Kinds.Images != 500 || p.Kinds.BuildCache != 40+20 || p.ReclaimableKinds.BuildCache != 20 {
		t.Errorf("platform's images %d, build cache %d (reclaimable %d): want 500, 60 (20: the shared record goes only with its blob's images, which a base image holds)", p.Kinds.Images, p.Kinds.BuildCache, p.ReclaimableKinds.BuildCache)
	}
	if du.BuildCacheShared != 70 {
		t.Errorf("BuildCacheShared %d, want 70", du.BuildCacheShared)
	}
	if p.Kinds.Other != du.StateDirBytes || du.StateDirBytes < 1000 {
		t.Errorf("other %d, state dir %d: containerd's root is outside, so other is the whole state dir", p.Kinds.Other, du.StateDirBytes)
	}
	if du.Bytes != p.Bytes || p.Bytes != p.Kinds.Sum() {
		t.Errorf("the rows do not add up: %d, platform %d, its kinds %d", du.Bytes, p.Bytes, p.Kinds.Sum())
	}
	if len(du.NotMeasured) != 1 || !strings.Contains(du.NotMeasured[0], "keeps its root outside") {
		t.Errorf("NotMeasured %q: want containerd's root outside the state dir said", du.NotMeasured)
	}

	m.OpenImages = func() (ImageStore, error) { return nil, errors.New("connection refused") }
	if du, err = m.Usage(context.Background(), nil, false); err != nil {
		t.Fatal(err)
	}
	if len(du.NotMeasured) != 1 || du.NotMeasured[0] != "images: containerd at /run/containerd.sock: connection refused" {
		t.Errorf("NotMeasured %q: want the images not measured, containerd named", du.NotMeasured)
	}
}
