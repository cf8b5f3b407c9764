package local

import (
	"context"
	"strings"
	"testing"
	"time"

	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	"bex.co/bex/internal/testenv"
)

// The image of a running instance stays when its release is pruned, and goes once
// the instance is gone; a name of another repository on the same digest (the
// image BuildKit made for this package's tests) stays throughout, and so does a
// reference of another repository passed by mistake.
func TestRemoveImagesSparesRunningAndForeignNames(t *testing.T) {
	f := newFixture(t, "images")
	ctx := context.Background()
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const repo = "bex.local/shop"
	// v1 named as the builder names its images, <repo>:<commit>, next to the
	// name it has already (docker.io/library/bex-local-test:v1).
	v1Digest := f.v1[strings.LastIndex(f.v1, "@")+1:]
	built, err := cl.ImageService().List(ctx, "target.digest=="+v1Digest)
	if err != nil || len(built) == 0 {
		t.Fatalf("v1 in containerd: %v %v", built, err)
	}
	ours := cimages.Image{Name: repo + ":running", Target: built[0].Target}
	if _, err := cl.ImageService().Create(ctx, ours); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.ImageService().Delete(context.Background(), ours.Name) })
	unused, err := testenv.ImportTinyImage(ctx, f.cd, repo+":unused", []byte("unused"))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := testenv.ImportTinyImage(ctx, f.cd, "docker.io/library/foreign:1", []byte("foreign"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.ImageService().Delete(context.Background(), "docker.io/library/foreign:1") })

	snaps := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		if err := cl.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, i snapshots.Info) error { out[i.Name] = true; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	d := f.desired(1, repo+"@"+v1Digest, 1)
	f.syncUntil(d, time.Minute, "release 1 rolled out", rolledOut)
	// The instance's writable layer, on the copy of the image chowned into the
	// app's id range (remap.go).
	var instance string
	for id := range f.containers() {
		instance = id
	}
	copyKey := f.remapKey(ctx, cl, d.Image)
	if s := snaps(); !s[instance] || !s[copyKey] {
		t.Fatalf("the instance's layer %s (%v) and the image's copy %s (%v)", instance, s[instance], copyKey, s[copyKey])
	}

	removed, inUse, err := f.rt.removeImages(ctx, repo, []string{d.Image, repo + "@" + unused, "docker.io/library/foreign@" + foreign}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != repo+":unused" || len(inUse) != 1 || inUse[0] != d.Image {
		t.Fatalf("removed %v, in use %v; want only %s:unused removed, %s in use", removed, inUse, repo, d.Image)
	}
	present := func(name string) bool {
		t.Helper()
		_, err := cl.GetImage(ctx, name)
		if err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !present(ours.Name) || !present("docker.io/library/foreign:1") || present(repo+":unused") {
		t.Fatalf("after the first removal: %s %v, foreign %v, unused %v", ours.Name, present(ours.Name), present("docker.io/library/foreign:1"), present(repo+":unused"))
	}

	// The instance stops; now the image goes, and only under repo.
	if err := f.rt.Delete(ctx, f.key()); err != nil {
		t.Fatal(err)
	}
	removed, _, err = f.rt.removeImages(ctx, repo, []string{d.Image}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != ours.Name {
		t.Fatalf("removed %v, want %s", removed, ours.Name)
	}
	if present(ours.Name) || !present(built[0].Name) {
		t.Fatalf("%s present %v, %s present %v", ours.Name, present(ours.Name), built[0].Name, present(built[0].Name))
	}
	// The collector ran with the delete: the instance's layer is gone, and
	// the copy, which the deleted app's leases no longer keep
	// (TestOnlyTheLastTwoCopiesOfAnAppAreKept), with it.
	if after := snaps(); after[instance] || after[copyKey] {
		t.Errorf("after the app and its name went: its instance's layer %v, the image's copy %v; want both gone", after[instance], after[copyKey])
	}
}

// RemoveRepository (an app deleted) removes every name under the repository,
// released or only built, but leaves an image a container still runs and says
// so; once the instance is gone it removes that one too. A longer repository
// (bex.local/shop-2) and another name on the same digest stay.
func TestRemoveRepositoryWaitsForContainers(t *testing.T) {
	f := newFixture(t, "images-repo")
	ctx := context.Background()
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const repo = "bex.local/shop"
	v1Digest := f.v1[strings.LastIndex(f.v1, "@")+1:]
	built, err := cl.ImageService().List(ctx, "target.digest=="+v1Digest)
	if err != nil || len(built) == 0 {
		t.Fatalf("v1 in containerd: %v %v", built, err)
	}
	running := cimages.Image{Name: repo + ":running", Target: built[0].Target}
	if _, err := cl.ImageService().Create(ctx, running); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.ImageService().Delete(context.Background(), running.Name) })
	if _, err := testenv.ImportTinyImage(ctx, f.cd, repo+":built", []byte("built, never released")); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.ImportTinyImage(ctx, f.cd, repo+"-2:c1", []byte("another app")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.ImageService().Delete(context.Background(), repo+"-2:c1") })
	f.syncUntil(f.desired(1, repo+"@"+v1Digest, 1), time.Minute, "release 1 rolled out", rolledOut)

	removed, inUse, err := f.rt.removeRepository(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	if !inUse || len(removed) != 1 || removed[0] != repo+":built" {
		t.Fatalf("removed %v, in use %v; want %s:built removed and the running image reported in use", removed, inUse, repo)
	}
	if err := f.rt.Delete(ctx, f.key()); err != nil {
		t.Fatal(err)
	}
	removed, inUse, err = f.rt.removeRepository(ctx, repo)
	if err != nil || inUse || len(removed) != 1 || removed[0] != running.Name {
		t.Fatalf("after the instance went: removed %v, in use %v, %v; want %s", removed, inUse, err, running.Name)
	}
	for _, n := range []string{repo + "-2:c1", built[0].Name} {
		if _, err := cl.GetImage(ctx, n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	// Nothing left: no error, nothing in use.
	if inUse, err := f.rt.RemoveRepository(ctx, repo, nil); err != nil || inUse {
		t.Fatalf("an empty repository: in use %v, %v", inUse, err)
	}
}

func TestUnderRepo(t *testing.T) {
	for name, want := range map[string]bool{
		"bex.local/shop:abc":         true,
		"bex.local/shop@sha256:0123": true,
		"bex.local/shop":             false,
		"bex.local/shop-2:abc":       false,
		"bex.local/shop/x:abc":       false,
		"docker.io/library/shop:abc": false,
	} {
		if got := underRepo("bex.local/shop", name); got != want {
			t.Errorf("underRepo(%q) = %v, want %v", name, got, want)
		}
	}
}
