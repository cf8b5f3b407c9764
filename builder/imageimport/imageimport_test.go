package imageimport_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"

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

// bomb is img with a layer of one file of n zeros on top: gzip makes it a few
// hundred KiB, which passes MaxBytes, and it unpacks to n.
func bomb(t *testing.T, img v1.Image, n int64) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "zeros", Mode: 0o644, Size: n, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	gz := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil })
	if err != nil {
		t.Fatal(err)
	}
	out, err := mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

const unpackBound = 64 << 20

// wantUnpacksPast checks an import's refusal for unpacking past unpackBound.
func wantUnpacksPast(t *testing.T, err error, ref string) {
	t.Helper()
	want := ref + " unpacks to more than 64 MiB (its layers expand past the bound an image may unpack to): "
	if !errors.Is(err, imageimport.ErrInvalid) || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("an image that unpacks to 200 MiB, bound %d: %v", unpackBound, err)
	}
	t.Log(err)
}

// TestAnImageThatUnpacksPastTheBoundIsNotUnpacked is one machine: an image
// with a layer of 200 MiB of zeros (a few hundred KiB compressed, well within
// MaxBytes) is refused with MaxUnpackedBytes at 64 MiB, on one line; no image
// is named, no layer unpacked, and its content is collected; an ordinary image
// still imports with the same bound.
func TestAnImageThatUnpacksPastTheBoundIsNotUnpacked(t *testing.T) {
	ctx := context.Background()
	pub := testregistry.Start(t, false)
	base := testregistry.ServingImage(t, busybox(t), "under the unpacked bound, one machine\n")
	big := bomb(t, base, 200<<20)
	bigRef := testregistry.Push(t, pub.Host+"/bomb/app:v1", big, "", "")
	testregistry.Push(t, pub.Host+"/fine/app:v1", base, "", "")

	cfg := imageimport.DefaultConfig()
	cfg.MaxUnpackedBytes = unpackBound
	im := localImporter(t, cfg)
	_, err := im.Import(ctx, "imp-bomb", pub.Host+"/bomb/app:v1", nil)
	wantUnpacksPast(t, err, pub.Host+"/bomb/app:v1")

	cl, err := testenv.SharedContainerd(t).Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx := namespaces.WithNamespace(ctx, testenv.Namespace)
	bigDigest := bigRef[strings.Index(bigRef, "@")+1:]
	if _, err := cl.GetImage(cctx, "bex.local/imp-bomb:image-"+strings.TrimPrefix(bigDigest, "sha256:")[:16]); !errdefs.IsNotFound(err) {
		t.Errorf("the refused image is named in containerd: %v", err)
	}
	layers, err := big.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var chain []digest.Digest
	for _, l := range layers {
		h, _ := l.Digest()
		if _, err := cl.ContentStore().Info(cctx, digest.Digest(h.String())); !errdefs.IsNotFound(err) {
			t.Errorf("layer %s of the refused image is in the content store: %v", h, err)
		}
		d, _ := l.DiffID()
		chain = append(chain, digest.Digest(d.String()))
		if _, err := cl.SnapshotService("overlayfs").Stat(cctx, identity.ChainID(chain).String()); !errdefs.IsNotFound(err) {
			t.Errorf("a layer of the refused image is unpacked: %v", err)
		}
	}

	res, err := im.Import(ctx, "imp-bomb", pub.Host+"/fine/app:v1", nil)
	if err != nil {
		t.Fatalf("an ordinary image under the bound: %v", err)
	}
	stored, err := cl.GetImage(cctx, "bex.local/imp-bomb:image-"+strings.TrimPrefix(res.Image[strings.Index(res.Image, "@")+1:], "sha256:")[:16])
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := stored.IsUnpacked(cctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("the ordinary image is not unpacked: %v %v", ok, err)
	}
}

// TestAnImageThatUnpacksPastTheBoundIsNotTagged is a cluster: the same image
// is refused on one line while it streams into the platform's registry, and
// nothing is tagged; when the registry has its layers already (the write skips
// them) they are counted from the registry and it is refused the same; an
// ordinary image is copied.
func TestAnImageThatUnpacksPastTheBoundIsNotTagged(t *testing.T) {
	ctx := context.Background()
	pub := testregistry.Start(t, false)
	own := testregistry.Start(t, true)
	base := testregistry.ServingImage(t, busybox(t), "under the unpacked bound, a cluster\n")
	big := bomb(t, base, 200<<20)
	bigRef := testregistry.Push(t, pub.Host+"/bomb/app:v1", big, "", "")
	testregistry.Push(t, pub.Host+"/fine/app:v1", base, "", "")
	tagOf := func(app, ref string) name.Tag {
		tag, err := name.NewTag(own.Host + "/apps/" + app + ":image-" + strings.TrimPrefix(ref[strings.Index(ref, "@")+1:], "sha256:")[:16])
		if err != nil {
			t.Fatal(err)
		}
		return tag
	}

	cfg := imageimport.DefaultConfig()
	cfg.ImageRepo, cfg.Push = own.Host+"/apps", true
	cfg.MaxUnpackedBytes = unpackBound
	im, err := imageimport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = im.Import(ctx, "shop", pub.Host+"/bomb/app:v1", nil)
	wantUnpacksPast(t, err, pub.Host+"/bomb/app:v1")
	if _, err := remote.Head(tagOf("shop", bigRef)); err == nil {
		t.Errorf("the refused image is tagged in the platform's registry")
	}

	// The layers in the app's repository already, under another tag.
	testregistry.Push(t, own.Host+"/apps/depot:other", big, "", "")
	_, err = im.Import(ctx, "depot", pub.Host+"/bomb/app:v1", nil)
	wantUnpacksPast(t, err, pub.Host+"/bomb/app:v1")
	if _, err := remote.Head(tagOf("depot", bigRef)); err == nil {
		t.Errorf("the refused image is tagged in the platform's registry, its layers there already")
	}

	res, err := im.Import(ctx, "shop", pub.Host+"/fine/app:v1", nil)
	if err != nil {
		t.Fatalf("an ordinary image under the bound: %v", err)
	}
	if desc, err := remote.Head(tagOf("shop", res.Image)); err != nil || !strings.HasSuffix(res.Image, desc.Digest.String()) {
		t.Fatalf("the ordinary image is not tagged: %v %v", desc, err)
	}
}
