package testregistry

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry"
	// The htpasswd access controller, for StartPrivate.
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/sirupsen/logrus"
)

// Registry is one registry server.
type Registry struct {
	// Host is its host:port on loopback (plain HTTP).
	Host string
	// Root is the filesystem driver's root directory.
	Root string
	// Config is the path of its configuration file.
	Config string
}

// Start serves a registry until the test ends. deleteEnabled is its
// storage.delete.enabled.
func Start(t testing.TB, deleteEnabled bool) *Registry {
	t.Helper()
	return StartConfig(t, fmt.Sprintf(`version: 0.1
storage:
  filesystem: {rootdirectory: /var/lib/registry}
  delete: {enabled: %t}
http:
  addr: :5000
`, deleteEnabled))
}

// StartConfig serves a registry with the configuration conf (a config.yml, as
// the registry:3 image reads it) until the test ends, its filesystem root
// moved to a directory of the test (REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY,
// which the server and garbage-collect both apply over the file) and served on
// a loopback port whatever http.addr says. It sets the environment: not for
// parallel tests.
func StartConfig(t testing.TB, conf string) *Registry {
	t.Helper()
	return StartConfigOn(t, nil, conf)
}

// StartConfigOn is StartConfig served on ln (nil: a loopback port), e.g. a
// listener made inside a network namespace the test created, for clients
// that live there.
func StartConfigOn(t testing.TB, ln net.Listener, conf string) *Registry {
	t.Helper()
	dir := t.TempDir()
	r := &Registry{Root: filepath.Join(dir, "data"), Config: filepath.Join(dir, "config.yml")}
	if err := os.WriteFile(r.Config, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY", r.Root)
	f, err := os.Open(r.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := configuration.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	// The registry logs each request through logrus's standard logger (serve
	// configures it from log:, the handler alone does not), every 404 the tests
	// provoke as an error: not logged.
	logrus.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	srv := httptest.NewUnstartedServer(handlers.NewApp(ctx, cfg))
	if ln != nil {
		srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	t.Cleanup(func() { srv.Close(); cancel() })
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// GarbageCollect runs `registry garbage-collect --delete-untagged CONFIG`, the
// command infra/bex's CronJob runs, in process: blobs that no manifest of any
// repository references are deleted, and so are manifests without a tag.
// (The command exits the process on a failure.)
func (r *Registry) GarbageCollect(t testing.TB) {
	t.Helper()
	cmd := registry.RootCmd
	cmd.SetArgs([]string{"garbage-collect", "--delete-untagged", "--quiet", r.Config})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
}

// BlobBytes is the size of the blob data files on disk: what the collection frees.
func (r *Registry) BlobBytes(t testing.TB) int64 {
	t.Helper()
	var n int64
	blobs := filepath.Join(r.Root, "docker", "registry", "v2", "blobs")
	err := filepath.WalkDir(blobs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// HasBlob reports whether the blob digest (sha256:...) is on disk.
func (r *Registry) HasBlob(t testing.TB, digest string) bool {
	t.Helper()
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) < 2 {
		t.Fatalf("digest %q", digest)
	}
	_, err := os.Stat(filepath.Join(r.Root, "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}
