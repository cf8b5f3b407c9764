package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"

	containerd "github.com/containerd/containerd/v2/client"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/machine/imagebuild"
)

// ImportTinyImage imports into c's Namespace a one-layer image named name whose
// layer holds the file /payload with payload, unpacked for overlayfs, and returns
// its manifest digest. Distinct payloads make distinct images (own layer, config,
// manifest and snapshot) in a few milliseconds, without BuildKit or a registry:
// for tests about what happens to images rather than what they run.
func ImportTinyImage(ctx context.Context, c *Containerd, name string, payload []byte) (string, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "payload", Mode: 0o644, Size: int64(len(payload)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(payload); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	img, err := imagebuild.LayerImage(layer.Bytes(), nil, []string{"/payload"})
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "bex-tiny-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	digest, err := imagebuild.WriteLayout(dir, img, map[string]string{"io.containerd.image.name": name})
	if err != nil {
		return "", err
	}
	archive, err := baseimage.TarDir(dir)
	if err != nil {
		return "", err
	}
	cl, err := c.Client()
	if err != nil {
		return "", err
	}
	defer cl.Close()
	imgs, err := cl.Import(ctx, bytes.NewReader(archive))
	if err != nil {
		return "", fmt.Errorf("import %s: %w", name, err)
	}
	if len(imgs) != 1 || imgs[0].Name != name {
		return "", fmt.Errorf("import %s: got %v", name, imgs)
	}
	if err := containerd.NewImage(cl, imgs[0]).Unpack(ctx, "overlayfs"); err != nil {
		return "", fmt.Errorf("unpack %s: %w", name, err)
	}
	return digest, nil
}
