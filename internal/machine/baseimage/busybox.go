package baseimage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"bex.co/bex/internal/machine/imagebuild"
)

// BusyboxRef is the name the busybox base image gets in containerd: what `FROM
// busybox` resolves to when BuildKit resolves images locally.
const BusyboxRef = "docker.io/library/busybox:latest"

// ImportBusybox packs the static busybox at bin (Debian's busybox-static) as a
// one-layer OCI image (the binary, a link per applet in /bin, /etc/passwd with
// root and nobody, /tmp) and imports it into cl's namespace as BusyboxRef,
// unpacked for the overlayfs snapshotter. dir holds the OCI layout on the way.
// It returns the manifest digest. No registry is involved.
func ImportBusybox(ctx context.Context, cl *containerd.Client, bin, dir string) (string, error) {
	img, err := BusyboxImage(bin)
	if err != nil {
		return "", err
	}
	layoutDir := filepath.Join(dir, "busybox-oci")
	digest, err := imagebuild.WriteLayout(layoutDir, img, map[string]string{
		"io.containerd.image.name":          BusyboxRef,
		"org.opencontainers.image.ref.name": "latest",
	})
	if err != nil {
		return "", err
	}
	archive, err := TarDir(layoutDir)
	if err != nil {
		return "", err
	}
	imgs, err := cl.Import(ctx, bytes.NewReader(archive))
	if err != nil {
		return "", fmt.Errorf("import busybox into containerd: %w", err)
	}
	if len(imgs) != 1 || imgs[0].Name != BusyboxRef {
		return "", fmt.Errorf("import busybox into containerd: got %v, want one image %s", imgs, BusyboxRef)
	}
	if err := containerd.NewImage(cl, imgs[0]).Unpack(ctx, "overlayfs"); err != nil {
		return "", fmt.Errorf("unpack busybox: %w", err)
	}
	return digest, nil
}

// BusyboxImage is the busybox base image ImportBusybox imports, for a registry
// (hack/cluster-local.sh pushes it to a cluster's).
func BusyboxImage(bin string) (v1.Image, error) {
	layerTar, err := busyboxLayer(bin)
	if err != nil {
		return nil, err
	}
	return imagebuild.LayerImage(layerTar, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, []string{"sh"})
}

// HasBusybox reports whether cl's namespace has an image named BusyboxRef.
func HasBusybox(ctx context.Context, cl *containerd.Client) (bool, error) {
	_, err := cl.GetImage(ctx, BusyboxRef)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// busyboxLayer is the uncompressed tar of the image's one layer.
func busyboxLayer(bin string) ([]byte, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", bin, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime})
	}
	file := func(name string, mode int64, content []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(content)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(content)
		return err
	}
	link := func(name, target string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: mtime})
	}
	steps := []error{
		dir("bin", 0o755), dir("etc", 0o755), dir("root", 0o700), dir("tmp", 0o1777),
		dir("usr", 0o755), dir("usr/bin", 0o755),
		file("bin/busybox", 0o755, data),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
		link("usr/bin/env", "/bin/busybox"),
	}
	for _, err := range steps {
		if err != nil {
			return nil, err
		}
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := link("bin/"+applet, "busybox"); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// TarDir archives the files below dir, paths relative to dir (an OCI layout,
// for containerd's import).
func TarDir(dir string) ([]byte, error) {
	var buf bytes.Buffer
	if err := tarDirTo(&buf, dir); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDirTo writes TarDir's archive to w as it reads the files, for layouts too
// large to hold in memory.
func tarDirTo(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
