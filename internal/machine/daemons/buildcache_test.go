package daemons

import (
	"path/filepath"
	"testing"
	"time"

	bkconfig "github.com/moby/buildkit/cmd/buildkitd/config"
	"golang.org/x/sys/unix"
)

// The policy is read back with buildkitd's own config loader, so a key or a value
// buildkitd would not understand (a TOML integer where it wants text, a misspelt
// key) fails here rather than leaving the cache unbounded.
func TestBuildkitdConfigBoundsTheCacheOfTheEnabledWorker(t *testing.T) {
	const size = 3 << 30
	for _, containerd := range []bool{true, false} {
		b := Buildkitd{Dir: t.TempDir(), Namespace: "bex", CgroupParent: "bex-builds-0123abcd", HTTPRegistries: []string{"127.0.0.1:5000"},
			CacheMaxBytes: size, CacheKeep: 36 * time.Hour}
		if containerd {
			b.ContainerdAddress = "/run/containerd.sock"
		}
		if _, err := b.WriteConfig(); err != nil {
			t.Fatal(err)
		}
		cfg, err := bkconfig.LoadFile(filepath.Join(b.Dir, "buildkitd.toml"))
		if err != nil {
			t.Fatalf("buildkitd cannot read its config: %v\n%s", err, readFile(t, filepath.Join(b.Dir, "buildkitd.toml")))
		}
		gc, other := cfg.Workers.Containerd.GCConfig, cfg.Workers.OCI.GCConfig
		if !containerd {
			gc, other = other, gc
		}
		if len(other.GCPolicy) != 0 {
			t.Errorf("containerd %v: the disabled worker got a policy: %+v", containerd, other.GCPolicy)
		}
		if gc.GC == nil || !*gc.GC {
			t.Errorf("containerd %v: gc is not on", containerd)
		}
		p := gc.GCPolicy
		if len(p) != 2 {
			t.Fatalf("containerd %v: %d rules, want 2: %+v", containerd, len(p), p)
		}
		// First: age alone, no size (it removes every unshared record older).
		if p[0].KeepDuration.Duration != 36*time.Hour || p[0].MaxUsedSpace != (bkconfig.DiskSpace{}) || p[0].All || len(p[0].Filters) != 0 {
			t.Errorf("containerd %v: rule 1 %+v", containerd, p[0])
		}
		// Then the size, over the unshared records only (no all rule).
		if r := p[1]; r.MaxUsedSpace.Bytes != size || r.All || r.KeepDuration.Duration != 0 || r.ReservedSpace != (bkconfig.DiskSpace{}) || r.MinFreeSpace != (bkconfig.DiskSpace{}) {
			t.Errorf("containerd %v: rule 2 %+v", containerd, r)
		}
		// The cgroup parent still lands in the worker's section.
		if containerd && cfg.Workers.Containerd.DefaultCgroupParent != b.CgroupParent || !containerd && cfg.Workers.OCI.DefaultCgroupParent != b.CgroupParent {
			t.Errorf("containerd %v: cgroup parent lost: %+v", containerd, cfg.Workers)
		}
	}
}

// Without a keep duration the age rule goes; without a size, buildkitd's default
// policy stays (no gcpolicy written).
func TestBuildkitdConfigCacheWithoutKeepOrSize(t *testing.T) {
	b := Buildkitd{Dir: t.TempDir(), ContainerdAddress: "/run/containerd.sock", Namespace: "bex", CacheMaxBytes: 1 << 30}
	if _, err := b.WriteConfig(); err != nil {
		t.Fatal(err)
	}
	cfg, err := bkconfig.LoadFile(filepath.Join(b.Dir, "buildkitd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Workers.Containerd.GCPolicy; len(p) != 1 || p[0].MaxUsedSpace.Bytes != 1<<30 || p[0].KeepDuration.Duration != 0 || p[0].All {
		t.Errorf("no keep: %+v", p)
	}
	b = Buildkitd{Dir: t.TempDir(), ContainerdAddress: "/run/containerd.sock", Namespace: "bex", CacheKeep: time.Hour}
	if _, err := b.WriteConfig(); err != nil {
		t.Fatal(err)
	}
	if cfg, err = bkconfig.LoadFile(filepath.Join(b.Dir, "buildkitd.toml")); err != nil {
		t.Fatal(err)
	}
	if p := cfg.Workers.Containerd.GCPolicy; len(p) != 0 {
		t.Errorf("no size: %+v", p)
	}
}

func TestDefaultBuildCacheBytes(t *testing.T) {
	for _, c := range []struct{ fs, want int64 }{
		{fs: 50 << 30, want: 5 << 30},   // a tenth of a small disk
		{fs: 100 << 30, want: 10 << 30}, // the two meet
		{fs: 2 << 40, want: 10 << 30},   // capped on a large one
		{fs: 1 << 30, want: (1 << 30) / 10},
	} {
		if got := defaultBuildCacheBytes(c.fs); got != c.want {
			t.Errorf("file system of %d bytes: %d, want %d", c.fs, got, c.want)
		}
	}
	// On a real directory: its file system's size, as statfs gives it.
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	got, err := DefaultBuildCacheBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := min(10<<30, int64(st.Blocks)*int64(st.Bsize)/10); got != want || got <= 0 {
		t.Errorf("%s: %d, want %d", dir, got, want)
	}
	if _, err := DefaultBuildCacheBytes(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory gave a size")
	}
}
