package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"bex.co/bex/internal/machine/imagebuild"
)

// PauseImage is the pause image's name: the tag of Kubernetes' own pause of its
// release, under bex.local, a registry that does not exist (nothing pulls it).
const PauseImage = "bex.local/pause:3.10"

// RegistryImage is the name infra/bex/registry.yaml runs distribution's registry
// as.
const RegistryImage = "docker.io/library/registry:3"

// Path is the images' PATH.
const Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// caCerts: what CoreDNS (forward over TLS), the registry (a proxy to an upstream)
// and buildkitd (pulling bases, pushing to a registry over TLS) check peers with.
const caCerts = "/etc/ssl/certs/ca-certificates.crt"

// cniDir is where Debian's containernetworking-plugins (hack/tools.sh installs
// it) keeps the CNI plugins: static Go programs, copied as they are.
const cniDir = "/usr/lib/cni"

// registryConfig is the registry image's own configuration, as the official
// image's: what it serves with when it is given no arguments. infra/bex mounts
// its own over /etc/distribution.
const registryConfig = `version: 0.1
log:
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: /var/lib/registry
http:
  addr: :5000
  headers:
    X-Content-Type-Options: [nosniff]
health:
  storagedriver:
    enabled: true
    interval: 10s
    threshold: 3
`

// Options says where Build finds its inputs and writes the archives.
type Options struct {
	// Root is the bex repository (hack/versions.env, hack/nodeimages/pause).
	Root string
	// Bin holds coredns-VERSION/, registry-VERSION/ and buildkit-VERSION/ as
	// hack/tools.sh builds them; empty, Root/bin.
	Bin string
	// Out receives the archives and images.env.
	Out string
	// Log, when set, receives a line per image.
	Log io.Writer
}

// Written is one archive Build wrote or found up to date.
type Written struct {
	Key     string // PAUSE, COREDNS, REGISTRY, BUILDKIT, CNPG: images.env's prefix
	Image   string // the name ctr import gives it
	Archive string // the docker archive's path
	Size    int64  // the archive's size in bytes
	Skipped bool   // its inputs were those of the archive already there
}

// spec is one image: its files (path in the image -> path here) and config.
type spec struct {
	key, file, image string
	files            map[string]string
	// layer, when set, makes the image's one layer instead of files.
	layer           func() ([]byte, error)
	entrypoint, cmd []string
}

// Build writes the five archives and Out/images.env.
func Build(ctx context.Context, o Options) ([]Written, error) {
	if o.Bin == "" {
		o.Bin = filepath.Join(o.Root, "bin")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	versions, err := readEnv(filepath.Join(o.Root, "hack", "versions.env"))
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"COREDNS_VERSION", "REGISTRY_VERSION", "BUILDKIT_VERSION", "CNPG_VERSION"} {
		if versions[k] == "" {
			return nil, fmt.Errorf("hack/versions.env has no %s", k)
		}
	}
	tool := func(dir, binary string) (string, error) {
		p := filepath.Join(o.Bin, dir, binary)
		if _, err := os.Stat(filepath.Join(o.Bin, dir, ".complete")); err != nil {
			return "", fmt.Errorf("%s is not built: run `make tools` (hack/tools.sh builds it)", p)
		}
		return p, nil
	}

	work, err := os.MkdirTemp(out, ".work-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	start := time.Now()
	pause, err := buildPause(o.Root, work)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "pause: built in %v\n", time.Since(start).Round(time.Millisecond))

	coredns, err := tool("coredns-"+versions["COREDNS_VERSION"], "coredns")
	if err != nil {
		return nil, err
	}
	registry, err := tool("registry-"+versions["REGISTRY_VERSION"], "registry")
	if err != nil {
		return nil, err
	}
	buildkitDir := "buildkit-" + versions["BUILDKIT_VERSION"]
	buildkitd, err := tool(buildkitDir, "buildkitd")
	if err != nil {
		return nil, err
	}
	buildctl, err := tool(buildkitDir, "buildctl")
	if err != nil {
		return nil, err
	}
	cnpg, err := tool("cnpg-"+versions["CNPG_VERSION"], "manager")
	if err != nil {
		return nil, err
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, fmt.Errorf("runc is not installed (apt-get install runc, or make tools): %w", err)
	}
	regConfig := filepath.Join(work, "config.yml")
	if err := os.WriteFile(regConfig, []byte(registryConfig), 0o644); err != nil {
		return nil, err
	}

	specs := []spec{
		{key: "PAUSE", file: "pause.tar", image: PauseImage,
			files: map[string]string{"/pause": pause}, entrypoint: []string{"/pause"}},
		{key: "COREDNS", file: "coredns.tar", image: "bex.local/coredns:" + versions["COREDNS_VERSION"],
			files: map[string]string{"/coredns": coredns, caCerts: caCerts}, entrypoint: []string{"/coredns"}},
		{key: "REGISTRY", file: "registry.tar", image: RegistryImage,
			files:      map[string]string{"/bin/registry": registry, "/etc/distribution/config.yml": regConfig, caCerts: caCerts},
			entrypoint: []string{"/bin/registry"}, cmd: []string{"serve", "/etc/distribution/config.yml"}},
		// What buildkitd's OCI worker runs: runc for each step (at /usr/sbin,
		// where PATH finds it), and the CNI plugins of the steps' network where
		// BuildKit's own image has them (infra/bex/buildkitd.yaml links them by
		// their plugin names). Its other needs (overlay and the mounts of a
		// step) are the kernel's, given a privileged container.
		{key: "BUILDKIT", file: "buildkit.tar", image: "docker.io/moby/buildkit:" + versions["BUILDKIT_VERSION"],
			files: map[string]string{"/usr/bin/buildkitd": buildkitd, "/usr/bin/buildctl": buildctl,
				"/usr/sbin/runc": runc, caCerts: caCerts,
				"/usr/bin/buildkit-cni-bridge":     filepath.Join(cniDir, "bridge"),
				"/usr/bin/buildkit-cni-host-local": filepath.Join(cniDir, "host-local"),
				"/usr/bin/buildkit-cni-loopback":   filepath.Join(cniDir, "loopback")},
			entrypoint: []string{"buildkitd"}},
		// CloudNativePG's operator, laid out as upstream's image: the operator
		// hashes operator/manager_<arch> (relative to its working directory,
		// /) and the Postgres pods' init container runs `/manager bootstrap
		// /controller/manager`, which copies "manager" (its own name) from
		// there. Static: the manager alone.
		{key: "CNPG", file: "cloudnative-pg.tar", image: CNPGImage(versions["CNPG_VERSION"]),
			layer: func() ([]byte, error) { return cnpgLayer(cnpg) }, entrypoint: []string{"/manager"}},
	}
	var written []Written
	var env strings.Builder
	for _, s := range specs {
		start := time.Now()
		w, err := s.write(out)
		if err != nil {
			return written, fmt.Errorf("%s: %w", s.image, err)
		}
		what := "written"
		if w.Skipped {
			what = "up to date"
		}
		fmt.Fprintf(o.Log, "%s: %s %s (%d bytes) in %v\n", s.image, w.Archive, what, w.Size, time.Since(start).Round(time.Millisecond))
		written = append(written, w)
		fmt.Fprintf(&env, "%s_IMAGE=%s\n%s_ARCHIVE=%s\n", w.Key, w.Image, w.Key, w.Archive)
	}
	if err := writeAtomic(filepath.Join(out, "images.env"), []byte(env.String())); err != nil {
		return written, err
	}
	return written, nil
}

// write writes s's archive into dir unless the archive there was made of the same
// layer and config, as its .inputs file records.
func (s spec) write(dir string) (Written, error) {
	w := Written{Key: s.key, Image: s.image, Archive: filepath.Join(dir, s.file)}
	tag, err := name.NewTag(s.image, name.StrictValidation)
	if err != nil {
		return w, err
	}
	var layer []byte
	if s.layer != nil {
		layer, err = s.layer()
	} else {
		layer, err = imagebuild.HostLayer(s.files)
	}
	if err != nil {
		return w, err
	}
	// The inputs: the layer and everything the config is made of, so that a
	// change of any file or setting writes the archive again. Hashing them is
	// cheap; compressing the layer (which the image's digests need) is not.
	env := []string{"PATH=" + Path}
	settings, err := json.Marshal([]any{s.image, "linux", "amd64", env, s.entrypoint, s.cmd})
	if err != nil {
		return w, err
	}
	h := sha256.New()
	h.Write(settings)
	h.Write(layer)
	inputs := hex.EncodeToString(h.Sum(nil))
	if w, done := upToDate(w, inputs); done {
		return w, nil
	}
	img, err := layerImage(layer, s.entrypoint, s.cmd)
	if err != nil {
		return w, err
	}
	return writeArchive(w, inputs, func(f io.Writer) error { return tarball.Write(tag, img, f) })
}

// layerImage is the image of one layer for linux/amd64, with PATH set to Path.
func layerImage(layer []byte, entrypoint, cmd []string) (v1.Image, error) {
	img, err := imagebuild.LayerImage(layer, []string{"PATH=" + Path}, cmd)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = entrypoint
	return mutate.ConfigFile(img, cf)
}

// upToDate says whether w's archive was made of inputs (its .inputs file), and
// then gives its size.
func upToDate(w Written, inputs string) (Written, bool) {
	if old, err := os.ReadFile(w.Archive + ".inputs"); err == nil && string(old) == inputs {
		if fi, err := os.Stat(w.Archive); err == nil {
			w.Size, w.Skipped = fi.Size(), true
			return w, true
		}
	}
	return w, false
}

// writeArchive writes w's archive with write, through a temporary file and a
// rename, then its .inputs file: an archive whose inputs file says inputs is
// complete.
func writeArchive(w Written, inputs string, write func(io.Writer) error) (Written, error) {
	stamp := w.Archive + ".inputs"
	_ = os.Remove(stamp)
	tmp := w.Archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return w, err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, w.Archive)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return w, err
	}
	fi, err := os.Stat(w.Archive)
	if err != nil {
		return w, err
	}
	w.Size = fi.Size()
	return w, os.WriteFile(stamp, []byte(inputs), 0o644)
}

// buildPause builds hack/nodeimages/pause (static) into a file in dir and
// returns its path.
func buildPause(root, dir string) (string, error) {
	f, err := os.CreateTemp(dir, ".pause-")
	if err != nil {
		return "", err
	}
	f.Close()
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", f.Name(), "./hack/nodeimages/pause")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := build.CombinedOutput(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("go build ./hack/nodeimages/pause: %w\n%s", err, msg)
	}
	return f.Name(), nil
}

// readEnv reads the NAME=value lines of a shell file like hack/versions.env.
func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = strings.Trim(v, `"'`)
		}
	}
	return env, sc.Err()
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// CNPGImage is the name of CloudNativePG's operator image of version (v1.27.1:
// bex.local/cloudnative-pg:1.27.1, upstream's tag).
func CNPGImage(version string) string {
	return "bex.local/cloudnative-pg:" + strings.TrimPrefix(version, "v")
}

// cnpgLayer is the operator image's layer: the manager at
// /operator/manager_amd64, /manager a link to it (as upstream's image has
// them), and nothing else.
func cnpgLayer(manager string) ([]byte, error) {
	data, err := os.ReadFile(manager)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "operator/", Mode: 0o755, ModTime: mtime},
		{Typeflag: tar.TypeReg, Name: "operator/manager_amd64", Mode: 0o755, Size: int64(len(data)), ModTime: mtime},
		{Typeflag: tar.TypeSymlink, Name: "manager", Linkname: "operator/manager_amd64", Mode: 0o777, ModTime: mtime},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
