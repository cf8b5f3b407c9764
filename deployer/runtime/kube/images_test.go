package kube_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// pushed is an image in the registry: its digest reference and its layers.
type pushed struct {
	ref    string // <repo>@sha256:...
	layers []string
}

// push writes img to the registry as repo:tag, as BuildKit pushes a build.
func push(t *testing.T, repo, tag string, img v1.Image) pushed {
	t.Helper()
	ref, err := name.NewTag(repo + ":" + tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	p := pushed{ref: repo + "@" + d.String()}
	for _, l := range ls {
		ld, _ := l.Digest()
		p.layers = append(p.layers, ld.String())
	}
	return p
}

func randomImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// exists reports whether ref (a tag or a digest reference) resolves in the registry.
func exists(t *testing.T, ref string) bool {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	_, err = remote.Head(r)
	if err != nil && !is404(err) {
		t.Fatal(err)
	}
	return err == nil
}

// On a cluster the images of pruned releases are deleted from a real CNCF
// distribution registry (the registry:3 code, in process): the manifest and its
// tag go, a kept release's digest stays, and nothing of another repository is
// touched — not a longer name (apps/shop-2), not the same digest pushed to
// another repository. The registry's garbage collection (the CronJob's command)
// then frees the deleted image's blobs on disk and keeps the shared ones.
// Deleting the app's repository (apps:destroy) removes the rest.
func TestPrunedReleasesAreDeletedFromTheRegistry(t *testing.T) {
	reg := testregistry.Start(t, true)
	cp := testenv.SharedControlPlane(t)
	rt, err := kube.New(kube.Config{RegistryDelete: true}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	repo := reg.Host + "/apps/shop"
	shared := randomImage(t)
	r1 := push(t, repo, "c1", randomImage(t))
	r2 := push(t, repo, "c2", shared)
	r3 := push(t, repo, "c3", randomImage(t))
	// Controls: another app whose name begins with this one's, and r2's very
	// image pushed to another repository.
	other := push(t, reg.Host+"/apps/shop-2", "c1", randomImage(t))
	alias := push(t, reg.Host+"/other/shop", "c2", shared)
	// r1 and r2 are pruned, r2's digest is used again by a kept release (a push
	// of the same commit), r3 is kept; references of other repositories in the
	// lists are ignored.
	inUse, err := rt.RemoveImages(ctx, repo, []string{r1.ref, r2.ref, other.ref, alias.ref}, []string{r3.ref, r2.ref})
	if err != nil || len(inUse) != 0 {
		t.Fatalf("RemoveImages = %v, %v", inUse, err)
	}
	for ref, want := range map[string]bool{r1.ref: false, repo + ":c1": false, r2.ref: true, repo + ":c2": true, r3.ref: true,
		other.ref: true, alias.ref: true, reg.Host + "/other/shop:c2": true} {
		if got := exists(t, ref); got != want {
			t.Errorf("%s in the registry: %v, want %v", ref, got, want)
		}
	}
	// Deleting is idempotent: a manifest already gone is no error.
	if _, err := rt.RemoveImages(ctx, repo, []string{r1.ref}, nil); err != nil {
		t.Fatalf("RemoveImages again: %v", err)
	}

	before := reg.BlobBytes(t)
	reg.GarbageCollect(t)
	after := reg.BlobBytes(t)
	for _, l := range r1.layers {
		if reg.HasBlob(t, l) {
			t.Errorf("layer %s of the deleted image is still on disk after garbage-collect", l)
		}
	}
	for _, p := range []pushed{r2, r3, other} {
		for _, l := range p.layers {
			if !reg.HasBlob(t, l) {
				t.Errorf("layer %s of the kept %s was collected", l, p.ref)
			}
		}
	}
	t.Logf("blobs on disk: %d bytes before the collection, %d after (one image of 2 × 64 KiB layers deleted)", before, after)
	if freed := before - after; freed < 2*64<<10 {
		t.Errorf("the collection freed %d bytes, want at least the deleted image's two layers", freed)
	}

	// apps:destroy: every manifest of the repository goes (tags and the
	// releases' digests); the controls stay, shared layers included.
	if _, err := rt.RemoveRepository(ctx, repo, []string{r2.ref}); err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]bool{r2.ref: false, r3.ref: false, repo + ":c3": false, other.ref: true, alias.ref: true} {
		if got := exists(t, ref); got != want {
			t.Errorf("after RemoveRepository, %s in the registry: %v, want %v", ref, got, want)
		}
	}
	reg.GarbageCollect(t)
	for _, l := range r3.layers {
		if reg.HasBlob(t, l) {
			t.Errorf("layer %s of the destroyed app is still on disk", l)
		}
	}
	for _, p := range []pushed{alias, other} {
		for _, l := range p.layers {
			if !reg.HasBlob(t, l) {
				t.Errorf("layer %s of %s was collected with the destroyed app", l, p.ref)
			}
		}
	}
	// A repository that is gone is no error.
	if _, err := rt.RemoveRepository(ctx, repo, nil); err != nil {
		t.Fatalf("RemoveRepository of an empty repository: %v", err)
	}
}

// Without RegistryDelete nothing is deleted; a registry that refuses deletes
// says how to allow them.
func TestRegistryDeletionIsConfigured(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	reg := testregistry.Start(t, false)
	repo := reg.Host + "/apps/shop"
	r1 := push(t, repo, "c1", randomImage(t))
	off, err := kube.New(kube.Config{}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.RemoveImages(context.Background(), repo, []string{r1.ref}, nil); err != nil || !exists(t, r1.ref) {
		t.Fatalf("RegistryDelete off: err %v, image there %v", err, exists(t, r1.ref))
	}
	on, err := kube.New(kube.Config{RegistryDelete: true}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	_, err = on.RemoveImages(context.Background(), repo, []string{r1.ref}, nil)
	if err == nil || !strings.Contains(err.Error(), "enable storage.delete.enabled") {
		t.Fatalf("a registry without deletes: %v", err)
	}
}

// is404 reports the registry's 404: the manifest is not there.
func is404(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
