package baseimage_test

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestStandIns builds the stand-ins with the real mmdebstrap from Debian's mirror
// (or finds them in the machine's cache), imports them into the real containerd,
// and runs in each what the plans' Dockerfiles run: node and npm as the node
// user, go with GOPATH /go, python, pip and venv. A second Import must build
// nothing and take seconds.
func TestStandIns(t *testing.T) {
	c := testenv.SharedContainerd(t)
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cfg := testenv.StandInsConfig()
	cfg.Progress = testWriter{t}
	began := time.Now()
	imgs, err := baseimage.Import(ctx, cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first Import: %s", time.Since(began).Round(time.Millisecond))
	byKind := map[string]baseimage.Image{}
	for _, img := range imgs {
		byKind[img.Kind] = img
		t.Logf("%-8s %s %s built=%v (%s)", img.Kind, img.Name, img.Digest, img.Built, layoutSize(t, img.Layout))
	}

	run := func(image string, args ...string) string {
		t.Helper()
		out, code, err := c.Run(ctx, image, args...)
		if err != nil || code != 0 {
			t.Fatalf("run %s %q: exit %d, err %v:\n%s", image, args, code, err, out)
		}
		return out
	}
	n := cfg.Names
	if out := run(n.Debian, "sh", "-c", "echo debian $(cat /etc/debian_version)"); !strings.HasPrefix(out, "debian 12.") {
		t.Errorf("debian: %q, want Debian 12", out)
	}
	// npm's registry over HTTPS, as npm ci reaches it: through this machine's way
	// out, whose TLS-inspecting proxy's CA (in LocalCAs) the stand-in trusts.
	out := run(n.Node, "sh", "-c", `id node; node --version; npm --version; echo yarn $(yarn --version); ls -ld /home/node; node -e 'fetch("https://registry.npmjs.org/express").then(r => console.log("registry", r.status), e => console.log("registry", e.cause || e))'`)
	for _, want := range []string{"uid=1000(node) gid=1000(node)", "\nv18.", "node node", "/home/node", "registry 200", "yarn 1."} {
		if !strings.Contains(out, want) {
			t.Errorf("node: %q lacks %q", out, want)
		}
	}
	goVersion, err := os.ReadFile(cfg.GoRoot + "/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	gov, _, _ := strings.Cut(string(goVersion), "\n")
	out = run(n.Go, "sh", "-c", "go version; go env GOPATH GOTOOLCHAIN; pwd; git --version")
	for _, want := range []string{"go version " + gov + " ", "\n/go\nlocal\n/go\n", "git version"} {
		if !strings.Contains(out, want) {
			t.Errorf("golang: %q lacks %q", out, want)
		}
	}
	// pip installs into the system as the official image lets it (no
	// externally-managed refusal): --dry-run with nothing to fetch says so without a
	// registry.
	out = run(n.Python, "sh", "-c", "python --version; pip --version; python -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.prefix)'; test ! -e /usr/lib/python3.11/EXTERNALLY-MANAGED && echo managed-by-pip")
	for _, want := range []string{"Python 3.11", "pip ", "/tmp/v\n", "managed-by-pip"} {
		if !strings.Contains(out, want) {
			t.Errorf("python: %q lacks %q", out, want)
		}
	}
	// The runtime has no shell: running one fails, and its files are checked in its
	// layer.
	if out, code, err := c.Run(ctx, n.Runtime, "/bin/sh", "-c", "true"); err == nil && code == 0 {
		t.Errorf("the runtime ran /bin/sh: %q", out)
	}
	files := layerFiles(t, byKind["runtime"].Layout)
	for _, want := range []string{"etc/ssl/certs/ca-certificates.crt", "usr/share/zoneinfo/UTC", "usr/share/zoneinfo/Europe/Berlin", "etc/passwd", "tmp/"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the runtime has no %s", want)
		}
	}
	if !strings.Contains(files["etc/passwd"], "nobody:x:65534:65534:") {
		t.Errorf("the runtime's /etc/passwd has no nobody 65534: %q", files["etc/passwd"])
	}
	for name := range files {
		if strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "usr/bin/") {
			t.Errorf("the runtime has %s: it should have no programs", name)
		}
	}

	// Warm: everything from the cache, already in containerd.
	began = time.Now()
	again, err := baseimage.Import(ctx, cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	warm := time.Since(began)
	t.Logf("second Import: %s", warm.Round(time.Millisecond))
	for i, img := range again {
		if img.Built || img.Digest != imgs[i].Digest {
			t.Errorf("second Import built %s again (digest %s, first %s)", img.Kind, img.Digest, imgs[i].Digest)
		}
	}
	if warm > time.Minute {
		t.Errorf("second Import took %s: the cache should make it seconds", warm)
	}
}

// layerFiles lists the entries of the one layer of the layout's image, with the
// content of the small regular files.
func layerFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			var content string
			if hdr.Typeflag == tar.TypeReg && hdr.Size < 4096 {
				data, _ := io.ReadAll(tr)
				content = string(data)
			}
			files[strings.TrimPrefix(hdr.Name, "./")] = content
		}
		rc.Close()
	}
	return files
}

// layoutSize is the size of the layout's blobs (the compressed layer, mostly).
func layoutSize(t *testing.T, dir string) string {
	t.Helper()
	var total int64
	entries, err := os.ReadDir(dir + "/blobs/sha256")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil {
			total += fi.Size()
		}
	}
	return strings.TrimSpace(byteString(total)) + " compressed"
}

func byteString(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if strings.HasPrefix(line, "baseimage:") {
			w.t.Log(line)
		}
	}
	return len(p), nil
}
