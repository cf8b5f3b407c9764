package imageimport_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"bex.co/bex/builder/imageimport"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// logins is a Credentials of fixed logins.
type logins map[string][2]string

func (l logins) Registry(_ context.Context, host string) (string, string, bool, error) {
	c, ok := l[host]
	return c[0], c[1], ok, nil
}

// loopbackBlocked refuses what the gitserver's default policy refuses that a
// test can reach: loopback, and the metadata and link-local ranges.
func loopbackBlocked(ip netip.Addr) string {
	switch {
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	}
	return ""
}

func busybox(t *testing.T) string {
	t.Helper()
	bin, err := testenv.Binary("busybox")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func localImporter(t *testing.T, cfg imageimport.Config) *imageimport.Importer {
	t.Helper()
	c := testenv.SharedContainerd(t)
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	cfg.Containerd, cfg.Namespace = cl, testenv.Namespace
	im, err := imageimport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return im
}

// TestImportIntoContainerd is one machine: an image pushed to a real registry
// (distribution's, on loopback) lands in containerd under the app's repository,
// unpacked, pinned by the digest the registry has; a reference that does not
// exist is refused naming it; a private registry refuses the pull before a
// login and takes it after; a login's password is tried against the registry.
func TestImportIntoContainerd(t *testing.T) {
	ctx := context.Background()
	pub := testregistry.Start(t, false)
	priv := testregistry.StartPrivate(t, "ci", "s3cret")
	img := testregistry.ServingImage(t, busybox(t), "imported\n")
	pubRef := testregistry.Push(t, pub.Host+"/web/app:v1", img, "", "")
	privRef := testregistry.Push(t, priv.Host+"/team/app:v1", img, "ci", "s3cret")
	digest := pubRef[strings.Index(pubRef, "@")+1:]

	creds := logins{}
	cfg := imageimport.DefaultConfig()
	cfg.Credentials = creds
	im := localImporter(t, cfg)

	var progress strings.Builder
	res, err := im.Import(ctx, "imp-one", pub.Host+"/web/app:v1", &progress)
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != "bex.local/imp-one@"+digest || res.Source != pubRef {
		t.Fatalf("imported as %+v, pushed %s", res, pubRef)
	}
	if !strings.Contains(progress.String(), "Resolved "+pub.Host+"/web/app:v1 to "+pubRef) {
		t.Fatalf("progress:\n%s", progress.String())
	}
	cl, err := testenv.SharedContainerd(t).Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx := namespaces.WithNamespace(ctx, testenv.Namespace)
	stored, err := cl.GetImage(cctx, "bex.local/imp-one:image-"+strings.TrimPrefix(digest, "sha256:")[:16])
	if err != nil {
		t.Fatalf("the import is not in containerd under the app's repository: %v", err)
	}
	if stored.Target().Digest.String() != digest {
		t.Fatalf("containerd has %s, the registry %s", stored.Target().Digest, digest)
	}
	if ok, err := stored.IsUnpacked(cctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("not unpacked: %v %v", ok, err)
	}

	// By digest too, and again (the content is there already).
	if res, err := im.Import(ctx, "imp-one", pubRef, nil); err != nil || res.Image != "bex.local/imp-one@"+digest {
		t.Fatalf("by digest: %+v %v", res, err)
	}

	_, err = im.Import(ctx, "imp-one", pub.Host+"/web/app:nope", nil)
	if !errors.Is(err, imageimport.ErrNotFound) || !strings.Contains(err.Error(), pub.Host+"/web/app:nope does not exist") {
		t.Fatalf("a missing tag: %v", err)
	}
	_, err = im.Import(ctx, "imp-one", pub.Host+"/no/such:v1", nil)
	if !errors.Is(err, imageimport.ErrNotFound) || !strings.Contains(err.Error(), pub.Host+"/no/such:v1") {
		t.Fatalf("a missing repository: %v", err)
	}

	// Private: refused without a login, saying so; the login is checked
	// against the registry; with it the pull works.
	_, err = im.Import(ctx, "imp-two", priv.Host+"/team/app:v1", nil)
	if !errors.Is(err, imageimport.ErrUnauthorized) || !strings.Contains(err.Error(), "needs a login to pull "+priv.Host+"/team/app:v1") ||
		!strings.Contains(err.Error(), "registry:login "+priv.Host) {
		t.Fatalf("private, before a login: %v", err)
	}
	if err := im.CheckLogin(ctx, priv.Host, "ci", "wrong"); !errors.Is(err, imageimport.ErrUnauthorized) || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("a wrong password: %v", err)
	}
	if err := im.CheckLogin(ctx, priv.Host, "ci", "s3cret"); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	creds[priv.Host] = [2]string{"ci", "s3cret"}
	res, err = im.Import(ctx, "imp-two", priv.Host+"/team/app:v1", nil)
	if err != nil || res.Image != "bex.local/imp-two@"+digest || res.Source != privRef {
		t.Fatalf("private, after the login: %+v %v", res, err)
	}
	creds[priv.Host] = [2]string{"ci", "stale"}
	_, err = im.Import(ctx, "imp-two", priv.Host+"/team/app:v1", nil)
	if !errors.Is(err, imageimport.ErrUnauthorized) || !strings.Contains(err.Error(), "refused the login kept for it") || strings.Contains(err.Error(), "stale") {
		t.Fatalf("private, a stale login: %v", err)
	}
}

// TestImportRefusesWhatATenantMayNotReach: with the gitserver's default
// policy, a registry on loopback (given as an address or as a name that
// resolves there) and the metadata address are refused at the dial, before
// anything is sent, and bex's own store is not a source.
func TestImportRefusesWhatATenantMayNotReach(t *testing.T) {
	ctx := context.Background()
	pub := testregistry.Start(t, false)
	ref := testregistry.Push(t, pub.Host+"/web/app:v1", testregistry.ServingImage(t, busybox(t), "x"), "", "")
	port := pub.Host[strings.LastIndex(pub.Host, ":")+1:]

	cfg := imageimport.DefaultConfig()
	cfg.Blocked = loopbackBlocked
	im := localImporter(t, cfg)
	for _, bad := range []string{
		ref,
		"localhost:" + port + "/web/app:v1",
		"169.254.169.254/latest/meta-data:v1",
	} {
		_, err := im.Import(ctx, "imp-refused", bad, nil)
		if !errors.Is(err, imageimport.ErrRefused) || !strings.Contains(err.Error(), "--allow-private-registries") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if err := im.CheckLogin(ctx, pub.Host, "u", "p"); !errors.Is(err, imageimport.ErrRefused) {
		t.Errorf("a login on loopback: %v", err)
	}
	for _, bad := range []string{"bex.local/other-app:image-0123", "bex.local/other-app@sha256:" + strings.Repeat("a", 64), "https://example.com/x", "a b", ""} {
		if _, err := im.Import(ctx, "imp-refused", bad, nil); !errors.Is(err, imageimport.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestCopyIntoTheClusterRegistry is a cluster: the image is copied from a
// private registry into the platform's registry under the app's repository,
// tagged (the registry's garbage collection keeps tagged manifests), with the
// digest it had, so that the nodes pull it from there.
func TestCopyIntoTheClusterRegistry(t *testing.T) {
	ctx := context.Background()
	priv := testregistry.StartPrivate(t, "ci", "s3cret")
	own := testregistry.Start(t, true)
	img := testregistry.ServingImage(t, busybox(t), "copied\n")
	src := testregistry.Push(t, priv.Host+"/team/app:v2", img, "ci", "s3cret")
	digest := src[strings.Index(src, "@")+1:]

	cfg := imageimport.DefaultConfig()
	cfg.ImageRepo = own.Host + "/apps"
	cfg.Push = true
	cfg.Credentials = logins{priv.Host: {"ci", "s3cret"}}
	im, err := imageimport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := im.Import(ctx, "shop", priv.Host+"/team/app:v2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != own.Host+"/apps/shop@"+digest {
		t.Fatalf("copied as %s", res.Image)
	}
	tag, _ := name.NewTag(own.Host + "/apps/shop:image-" + strings.TrimPrefix(digest, "sha256:")[:16])
	desc, err := remote.Head(tag, remote.WithAuth(authn.Anonymous))
	if err != nil || desc.Digest.String() != digest {
		t.Fatalf("the platform's registry has %v (%v), want %s", desc, err, digest)
	}
	// Its own registry is not a source, even on a cluster.
	if _, err := im.Import(ctx, "other", res.Image, nil); !errors.Is(err, imageimport.ErrInvalid) {
		t.Fatalf("bex's own registry as a source: %v", err)
	}
}

// TestAnIndexResolvesToThisPlatformsImage: a multi-platform index is
// resolved to the manifest of linux and the machine's architecture, and that
// manifest's digest is what the release pins and what is copied (not the other
// platforms'); an image only for another platform is refused, saying which.
func TestAnIndexResolvesToThisPlatformsImage(t *testing.T) {
	ctx := context.Background()
	pub := testregistry.Start(t, false)
	own := testregistry.Start(t, true)
	native := testregistry.ServingImage(t, busybox(t), "native\n")
	other := "arm64"
	if goruntime.GOARCH == "arm64" {
		other = "amd64"
	}
	cf, err := native.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = other
	foreign, err := mutate.ConfigFile(native, cf)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: native, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}})
	tag, _ := name.NewTag(pub.Host + "/multi/app:v1")
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	testregistry.Push(t, pub.Host+"/foreign/app:v1", foreign, "", "")
	nativeDigest, _ := native.Digest()
	foreignDigest, _ := foreign.Digest()

	cfg := imageimport.DefaultConfig()
	cfg.ImageRepo, cfg.Push = own.Host+"/apps", true
	im, err := imageimport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := im.Import(ctx, "multi", pub.Host+"/multi/app:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != own.Host+"/apps/multi@"+nativeDigest.String() || res.Platform != "linux/"+goruntime.GOARCH {
		t.Fatalf("imported %+v, want the %s manifest %s", res, goruntime.GOARCH, nativeDigest)
	}
	copied, err := name.ParseReference(own.Host + "/apps/multi@" + foreignDigest.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Head(copied); err == nil {
		t.Errorf("the %s image was copied too", other)
	}
	_, err = im.Import(ctx, "multi", pub.Host+"/foreign/app:v1", nil)
	if !errors.Is(err, imageimport.ErrInvalid) || !strings.Contains(err.Error(), "is an image for linux/"+other) {
		t.Errorf("an image for %s: %v", other, err)
	}
}
