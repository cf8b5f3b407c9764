package imagebuild

import (
	"bytes"
	"io"
	"os"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// LayerImage is a linux image for this machine's architecture made of one layer,
// the uncompressed tar layer, with env as its environment and cmd (may be nil) as
// its command: how bex makes base images from local files, with no registry.
func LayerImage(layer []byte, env, cmd []string) (v1.Image, error) {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = env
	cf.Config.Cmd = cmd
	return mutate.ConfigFile(img, cf)
}

// WriteLayout writes img as the one image of a new OCI image layout at dir (what
// was there goes), with annotations on its index entry (a containerd image name,
// say). It returns the manifest's digest.
func WriteLayout(dir string, img v1.Image, annotations map[string]string) (string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	var opts []layout.Option
	if len(annotations) > 0 {
		opts = append(opts, layout.WithAnnotations(annotations))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
