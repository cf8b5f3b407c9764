package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	bkclient "github.com/moby/buildkit/client"
	"github.com/tonistiigi/fsutil"
)

// BaseName is the named context that replaces the Dockerfile's base stage.
const BaseName = "base"

// BaseFiles are what the base image needs from this machine: git (the gitserver
// runs `git upload-pack` for clones and fetches; upload-pack runs `git
// pack-objects`, found on PATH) and the CA certificates (ACME, registries).
var BaseFiles = []string{"/usr/bin/git", "/usr/lib/git-core/git", "/usr/lib/git-core/git-upload-pack", "/etc/ssl/certs/ca-certificates.crt"}

// Base writes an OCI image layout into dir whose one image holds BaseFiles, the
// shared libraries of the executables among them (as ldd lists them, with the
// dynamic loader), /etc/passwd and /etc/group with root and nonroot (65532), and
// /tmp. It returns the image manifest's digest.
func Base(dir string) (string, error) {
	layer, err := baseLayer(BaseFiles)
	if err != nil {
		return "", err
	}
	img, err := LayerImage(layer, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, nil)
	if err != nil {
		return "", err
	}
	return WriteLayout(dir, img, nil)
}

var lddPath = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x`)

// libraries lists the shared objects bin loads, the dynamic loader included.
// Libraries are the shared libraries path loads, as ldd lists them (the dynamic
// loader among them): what HostLayer adds for an executable, for a file it does
// not see as one (a module that a program opens at run time).
func Libraries(path string) ([]string, error) { return libraries(path) }

func libraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		// A static executable: ldd says so (on stderr) and exits non-zero.
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, m := range lddPath.FindAllSubmatch(out, -1) {
		libs = append(libs, string(m[1]))
	}
	return libs, nil
}

// baseLayer is the uncompressed tar of the base's one layer: HostLayer of files,
// each at its own path.
func baseLayer(files []string) ([]byte, error) {
	m := make(map[string]string, len(files))
	for _, f := range files {
		m[f] = f
	}
	layer, err := HostLayer(m)
	if err != nil {
		return nil, fmt.Errorf("base image: %w (install it: apt-get install git ca-certificates)", err)
	}
	return layer, nil
}

// HostLayer is the uncompressed tar of one layer made of this machine's files:
// files maps a path in the image to the path of the file here (the same path, or
// another: a binary of bin/ at /usr/bin, say). The layer also holds the shared
// libraries of the executables among them at their own paths (as ldd lists them,
// with the dynamic loader), /etc/passwd and /etc/group with root and nonroot
// (65532), and /tmp. A file at its own path that is a symbolic link here
// (/lib64/ld-linux-x86-64.so.2, /usr/lib/git-core/git-upload-pack) becomes a link
// to its target's real path, which holds the file; one at another path is copied
// there. The base image and hack/nodeimages's node images are made with it.
func HostLayer(files map[string]string) ([]byte, error) {
	type entry struct{ src, link string } // the file to copy, or the link's target
	entries := map[string]entry{}         // path in the image -> what it holds
	add := func(dst, src string) error {
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return err
		}
		if dst != src {
			entries[dst] = entry{src: real}
			return nil
		}
		entries[real] = entry{src: real}
		if real != src {
			entries[src] = entry{link: real}
		}
		return nil
	}
	for dst, src := range files {
		if err := add(dst, src); err != nil {
			return nil, err
		}
		if fi, err := os.Stat(src); err == nil && fi.Mode()&0o111 != 0 {
			libs, err := libraries(src)
			if err != nil {
				return nil, err
			}
			for _, l := range libs {
				if err := add(l, l); err != nil {
					return nil, err
				}
			}
		}
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dirs := map[string]bool{}
	var mkdirs func(d string) error
	mkdirs = func(d string) error {
		if d == "/" || d == "." || dirs[d] {
			return nil
		}
		if err := mkdirs(filepath.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: mtime})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := mkdirs(filepath.Dir(name)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(name, "/"), Mode: mode, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := mkdirs("/tmp"); err != nil {
		return nil, err
	}
	if err := file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n")); err != nil {
		return nil, err
	}
	if err := file("/etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")); err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if target := entries[p].link; target != "" {
			if err := mkdirs(filepath.Dir(p)); err != nil {
				return nil, err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(p, "/"), Linkname: target, Mode: 0o777, ModTime: mtime}); err != nil {
				return nil, err
			}
			continue
		}
		fi, err := os.Stat(entries[p].src)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(entries[p].src)
		if err != nil {
			return nil, err
		}
		if err := file(p, int64(fi.Mode().Perm()), data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Binary builds the static bex binary (CGO_ENABLED=0) of the module at root into
// dir/bex, with ldflags.
func Binary(ctx context.Context, root, dir, ldflags string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(dir, "bex"), "./cmd/bex")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/bex: %w\n%s", err, out)
	}
	return nil
}

// Options says what Build builds and where the image goes.
type Options struct {
	// Dockerfile is the path of hack/image/Dockerfile.
	Dockerfile string
	// Context is the build context: a directory holding the bex binary.
	Context string
	// BaseLayout and BaseDigest, when set, are the OCI layout (from Base) and
	// image that replace the Dockerfile's base stage; empty, the stage is built
	// as written (it pulls Debian).
	BaseLayout, BaseDigest string
	// OCIArchive, when set, receives the image as an OCI archive (tar).
	OCIArchive string
	// Name names the image; with Store, it is stored under that name in the
	// worker's image store (containerd) and unpacked, ready to run.
	Name  string
	Store bool
	// Progress receives the steps' names and output.
	Progress io.Writer
}

// Build builds the image with the buildkitd behind c and returns its manifest
// digest.
func Build(ctx context.Context, c *bkclient.Client, o Options) (string, error) {
	if o.OCIArchive == "" && !o.Store {
		return "", errors.New("imagebuild: no output: set OCIArchive or Store")
	}
	contextFS, err := fsutil.NewFS(o.Context)
	if err != nil {
		return "", err
	}
	dockerfileFS, err := fsutil.NewFS(filepath.Dir(o.Dockerfile))
	if err != nil {
		return "", err
	}
	attrs := map[string]string{"filename": filepath.Base(o.Dockerfile)}
	opt := bkclient.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: attrs,
		LocalMounts:   map[string]fsutil.FS{"context": contextFS, "dockerfile": dockerfileFS},
	}
	if o.BaseLayout != "" {
		store, err := local.NewStore(o.BaseLayout)
		if err != nil {
			return "", fmt.Errorf("base layout %s: %w", o.BaseLayout, err)
		}
		opt.OCIStores = map[string]content.Store{BaseName: store}
		attrs["context:"+BaseName] = "oci-layout://" + BaseName + "@" + o.BaseDigest
	}
	if o.OCIArchive != "" {
		if err := os.MkdirAll(filepath.Dir(o.OCIArchive), 0o755); err != nil {
			return "", err
		}
		attrs := map[string]string{}
		if o.Name != "" {
			attrs["name"] = o.Name
		}
		opt.Exports = append(opt.Exports, bkclient.ExportEntry{Type: bkclient.ExporterOCI, Attrs: attrs,
			Output: func(map[string]string) (io.WriteCloser, error) { return os.Create(o.OCIArchive) }})
	}
	if o.Store {
		opt.Exports = append(opt.Exports, bkclient.ExportEntry{Type: bkclient.ExporterImage,
			Attrs: map[string]string{"name": o.Name, "unpack": "true"}})
	}
	ch := make(chan *bkclient.SolveStatus)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range ch {
			if o.Progress == nil {
				continue
			}
			for _, v := range st.Vertexes {
				if v.Completed != nil {
					fmt.Fprintf(o.Progress, "%s\n", v.Name)
				}
				if v.Error != "" {
					fmt.Fprintf(o.Progress, "%s: %s\n", v.Name, v.Error)
				}
			}
			for _, l := range st.Logs {
				o.Progress.Write(l.Data)
			}
		}
	}()
	resp, err := c.Solve(ctx, nil, opt, ch)
	<-done
	if err != nil {
		return "", fmt.Errorf("build %s: %w", o.Dockerfile, err)
	}
	return resp.ExporterResponse["containerimage.digest"], nil
}
