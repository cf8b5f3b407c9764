package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// TestTheImagesCopyForTheAppsIDsOutlivesItsContainers: the chowned copy of an
// image for an app's ids is made once and kept as long as the image, not as
// long as the container that made it. Once the app's only instance is gone
// and containerd's garbage collector has run, the copy is still there, and
// the next instance (a scale up here; the web instance after a release
// command's one-off on a push) is made on it without a copy of its own.
func TestTheImagesCopyForTheAppsIDsOutlivesItsContainers(t *testing.T) {
	f := newFixture(t, "remap")
	d, _ := f.deployV1()
	ctx := namespaces.WithNamespace(context.Background(), f.cfg.Namespace)

	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	img, err := f.rt.image(ctx, f.v1)
	if err != nil {
		t.Fatal(err)
	}
	key := f.remapKey(ctx, cl, f.v1)
	sn := cl.SnapshotService(f.cfg.withDefaults().Snapshotter)
	if _, err := sn.Stat(ctx, key); err != nil {
		t.Fatalf("the copy %s after the first instance: %v", key, err)
	}

	scale := func(n int32) {
		web := d.Processes["web"]
		web.Replicas = n
		d.Processes["web"] = web
	}
	scale(0)
	f.syncUntil(d, time.Minute, "scaled to 0", func(runtime.Status) bool { return len(f.containers()) == 0 })
	collectGarbage(t, ctx, cl, img.Target())
	if _, err := sn.Stat(ctx, key); err != nil {
		t.Fatalf("the copy %s once no container used it and the GC ran: %v", key, err)
	}

	scale(1)
	f.syncUntil(d, time.Minute, "scaled to 1", rolledOut)
	f.logMu.Lock()
	logs := f.logs.String()
	f.logMu.Unlock()
	started := regexp.MustCompile(`msg="instance started".*remap_made=(true|false)`).FindAllStringSubmatch(logs, -1)
	if len(started) != 2 || started[1][1] != "false" {
		t.Fatalf("the instances started: %q; want 2, the second on the copy that was there", started)
	}
}

// TestOnlyTheLastTwoCopiesOfAnAppAreKept: leases keep the copies of the two
// images an app used last, not more: with no container on them, the copy of a
// third image lets the oldest go at the collector's next run, although its
// image stays. Deleting the app lets the others go.
func TestOnlyTheLastTwoCopiesOfAnAppAreKept(t *testing.T) {
	f := newFixture(t, "remap-kept")
	ctx := namespaces.WithNamespace(context.Background(), f.cfg.Namespace)
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	base, err := f.rt.store.ids(f.key().String())
	if err != nil {
		t.Fatal(err)
	}
	m := idmap{host: base, size: IDRangeSize}
	sn := cl.SnapshotService(f.cfg.withDefaults().Snapshotter)
	var keys []string
	for i := range 3 {
		name := fmt.Sprintf("bex.local/remap-kept:%d-%d", i, time.Now().UnixNano())
		if _, err := testenv.ImportTinyImage(ctx, f.cd, name, []byte(name)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.ImageService().Delete(context.Background(), name) })
		img, err := f.rt.image(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("remap-kept-%d", i)
		ctr, err := cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithSnapshotter(f.cfg.withDefaults().Snapshotter),
			withRemappedSnapshot(id, img, m, nil), containerd.WithNewSpec())
		if err != nil {
			t.Fatal(err)
		}
		if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, f.remapKey(ctx, cl, name))
	}
	img, err := f.rt.image(ctx, f.v1)
	if err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, ctx, cl, img.Target())
	for i, key := range keys {
		_, err := sn.Stat(ctx, key)
		if kept := err == nil; kept != (i > 0) {
			t.Errorf("copy %d of 3 kept: %v (%v); want the last two only", i+1, kept, err)
		}
	}

	if err := f.rt.Delete(ctx, f.key()); err != nil {
		t.Fatal(err)
	}
	collectGarbage(t, ctx, cl, img.Target())
	for i, key := range keys {
		if _, err := sn.Stat(ctx, key); !errdefs.IsNotFound(err) {
			t.Errorf("copy %d after the app was deleted: %v, want not found", i+1, err)
		}
	}
}

// remapKey is the key of the copy of image ref for the fixture's app's ids.
func (f *fixture) remapKey(ctx context.Context, cl *containerd.Client, ref string) string {
	f.t.Helper()
	ctx = namespaces.WithNamespace(ctx, f.cfg.Namespace)
	img, err := f.rt.image(ctx, ref)
	if err != nil {
		f.t.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	base, err := f.rt.store.ids(f.key().String())
	if err != nil {
		f.t.Fatal(err)
	}
	return remapKey(identity.ChainID(diffIDs).String(), idmap{host: base, size: IDRangeSize})
}

// collectGarbage runs containerd's collector to its end: a synchronous delete
// of an image record made for it (of target, which the real images keep).
func collectGarbage(t *testing.T, ctx context.Context, cl *containerd.Client, target ocispec.Descriptor) {
	t.Helper()
	is := cl.ImageService()
	tmp := cimages.Image{Name: "bex.test/gc-trigger:" + strings.ToLower(t.Name()), Target: target}
	if _, err := is.Create(ctx, tmp); err != nil {
		t.Fatal(err)
	}
	if err := is.Delete(ctx, tmp.Name, cimages.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
}

// TestChownToKeepsSpecialBitsAndRefusesForeignOwners: the copy's owners are
// the app's range, setuid survives the chown, a symlink is not followed, and a
// file owned outside the range is an error that names it.
func TestChownToKeepsSpecialBitsAndRefusesForeignOwners(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "su")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	m := idmap{host: 300000, size: IDRangeSize}
	if err := filepath.WalkDir(dir, chownTo(m)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 300000 || st.Gid != 300000 || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("su: %d:%d %v, want 300000:300000 and setuid", st.Uid, st.Gid, fi.Mode())
	}
	if fi, err := os.Stat("/etc/passwd"); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the symlink's target changed owner: %v", err)
	}
	foreign := filepath.Join(t.TempDir(), "foreign")
	if err := os.WriteFile(foreign, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(foreign, int(IDRangeSize)+5, 0); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(foreign, chownTo(m)); err == nil || !strings.Contains(err.Error(), "foreign is owned by 65541:0") {
		t.Errorf("a file owned outside the range: %v", err)
	}
}
