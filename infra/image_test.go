package infra

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"bex.co/bex/internal/machine/imagebuild"
	"bex.co/bex/internal/testenv"
)

// TestImageBuildsFromLocalBases builds hack/image/Dockerfile with the project's
// BuildKit from a base made on this machine (nothing pulled), both as `make image`
// does (an OCI archive) and into containerd, then runs the image: bex and git
// work in it.
func TestImageBuildsFromLocalBases(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bk := testenv.SharedBuildkitd(t)
	// A bound for a hang, not a speed check: the static build of cmd/bex
	// rebuilds every dependency with its own flags, which took over 5 min on
	// 2 cores beside the rest of the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	dir := t.TempDir()
	buildCtx := filepath.Join(dir, "context")
	if err := imagebuild.Binary(ctx, root, buildCtx, "-s -w -X main.version=infra-test"); err != nil {
		t.Fatal(err)
	}
	baseDigest, err := imagebuild.Base(filepath.Join(dir, "base"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := bk.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var progress strings.Builder
	const name = "bex.local/bex:infra-test"
	digest, err := imagebuild.Build(ctx, c, imagebuild.Options{
		Dockerfile: filepath.Join(root, "hack/image/Dockerfile"),
		Context:    buildCtx,
		BaseLayout: filepath.Join(dir, "base"), BaseDigest: baseDigest,
		OCIArchive: filepath.Join(dir, "bex-image.tar"),
		Name:       name, Store: true,
		Progress: &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("build returned digest %q", digest)
	}
	if strings.Contains(progress.String(), "apt-get") {
		t.Errorf("the Debian stage ran although the named context replaces it:\n%s", progress.String())
	}
	checkOCIArchive(t, filepath.Join(dir, "bex-image.tar"))

	run := func(want string, args ...string) {
		t.Helper()
		out, code, err := bk.Containerd.Run(ctx, name, args...)
		if err != nil {
			t.Fatalf("run %v: %v", args, err)
		}
		if !strings.Contains(out, want) {
			t.Errorf("run %v: exit %d, output %q, want it to contain %q", args, code, out, want)
		}
	}
	run("infra-test", "/usr/local/bin/bex", "version")
	run("git version", "git", "version")
	// upload-pack, as the gitserver runs it for a clone, loads and looks for the
	// repository (not there: git says so, as 65532 about a root-owned path).
	run("fatal: detected dubious ownership in repository at '/nonexistent.git'", "git", "upload-pack", "--strict", "/nonexistent.git")
}

// checkOCIArchive opens the OCI archive that `make image` writes and checks the
// image's configuration: bex as the entrypoint, a non-root user.
func checkOCIArchive(t *testing.T, path string) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if h.Typeflag == tar.TypeDir {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s is no OCI archive: %v", path, err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("%s: index %v, %v; want one image", path, m, err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/usr/local/bin/bex" {
		t.Errorf("entrypoint %q, want /usr/local/bin/bex", got)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	if layers, _ := img.Layers(); len(layers) != 2 {
		t.Errorf("%d layers, want 2 (the base, bex)", len(layers))
	}
}
