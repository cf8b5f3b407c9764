package testregistry

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	goruntime "runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/crypto/bcrypt"
)

// StartPrivate serves a registry as Start does, behind distribution's
// htpasswd authentication with one user: every request without that user's
// password is 401, as a private registry answers.
func StartPrivate(t testing.TB, user, password string) *Registry {
	t.Helper()
	return StartPrivateOn(t, nil, user, password)
}

// StartPrivateOn is StartPrivate served on ln (StartConfigOn).
func StartPrivateOn(t testing.TB, ln net.Listener, user, password string) *Registry {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := t.TempDir() + "/htpasswd"
	if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return StartConfigOn(t, ln, fmt.Sprintf(`version: 0.1
storage:
  filesystem: {rootdirectory: /var/lib/registry}
auth:
  htpasswd: {realm: bex-test, path: %s}
http:
  addr: :5000
`, htpasswd))
}

// ServingImage is a small image that serves text over HTTP on $PORT: Debian's
// static busybox (bin is its path) and /www/index.html, its command busybox's
// httpd, as an image from a registry brings its own command. Its platform is
// linux and the machine's architecture.
func ServingImage(t testing.TB, bin, text string) v1.Image {
	t.Helper()
	busybox, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"bin/busybox", 0o755, busybox}, {"www/index.html", 0o644, []byte(text)}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Env = []string{"PATH=/bin"}
	cf.Config.Cmd = []string{"/bin/busybox", "sh", "-c", `exec /bin/busybox httpd -f -h /www -p "$PORT"`}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Push writes img to the registry as ref (HOST/REPO:TAG), with user and
// password when not empty, and returns its digest reference.
func Push(t testing.TB, ref string, img v1.Image, user, password string) string {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.Anonymous
	if user != "" {
		auth = &authn.Basic{Username: user, Password: password}
	}
	if err := remote.Write(tag, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return tag.Context().Digest(d.String()).Name()
}

// WithCmd is img with cmd as its command.
func WithCmd(t testing.TB, img v1.Image, cmd ...string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Cmd = cmd
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
