package imageimport_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"bex.co/bex/builder/imageimport"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// smallDisk mounts a tmpfs of size bytes for the test: the disk an import
// checks and watches (Config.DiskDir), as the state dir's would be.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// withRandomLayer is img with a layer of n random (incompressible) bytes.
func withRandomLayer(t *testing.T, img v1.Image, n int64) v1.Image {
	t.Helper()
	mt := types.OCILayer
	if m, err := img.MediaType(); err == nil && m == types.DockerManifestSchema2 {
		mt = types.DockerLayer
	}
	l, err := random.Layer(n, mt)
	if err != nil {
		t.Fatal(err)
	}
	out, err := mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// notNamed fails the test when containerd has the app's import of digest.
func notNamed(t *testing.T, app, ref string) {
	t.Helper()
	cl, err := testenv.SharedContainerd(t).Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	digest := ref[strings.Index(ref, "@sha256:")+8:]
	ctx := namespaces.WithNamespace(context.Background(), testenv.Namespace)
	if _, err := cl.GetImage(ctx, "bex.local/"+app+":image-"+digest[:16]); !errdefs.IsNotFound(err) {
		t.Errorf("a refused import is named in containerd: %v", err)
	}
}

func wantOneLine(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: imported", what)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%s: more than one line: %q", what, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %q does not say %q", what, err, p)
		}
	}
	t.Logf("%s: %v", what, err)
}

// TestImportRefusesAnImageTheDiskCannotHold is one machine with a disk of 16
// MiB that keeps 4 MiB free: an image of 14 MiB compressed is refused before
// the pull, one that is 1 MiB compressed and unpacks to 20 MiB once its
// layers are in (before anything is unpacked), each with one line and
// nothing named; the ordinary image imports with the same disk.
func TestImportRefusesAnImageTheDiskCannotHold(t *testing.T) {
	ctx := context.Background()
	reg := testregistry.Start(t, false)
	base := testregistry.ServingImage(t, busybox(t), "fits\n")
	big := testregistry.Push(t, reg.Host+"/disk/big:v1", withRandomLayer(t, base, 14<<20), "", "")
	expands := testregistry.Push(t, reg.Host+"/disk/expands:v1", bomb(t, base, 20<<20), "", "")
	testregistry.Push(t, reg.Host+"/disk/ok:v1", base, "", "")

	cfg := imageimport.DefaultConfig()
	cfg.DiskDir, cfg.MinFreeBytes, cfg.MinFreePercent = smallDisk(t, "16m"), 4<<20, 100
	im := localImporter(t, cfg)

	_, err := im.Import(ctx, "disk", reg.Host+"/disk/big:v1", nil)
	wantOneLine(t, "14 MiB compressed", err, reg.Host+"/disk/big:v1 is 1", "and the disk of "+cfg.DiskDir+" has 16 MiB free, 4.0 MiB of it kept by bex", "deploy the image again")
	if !errors.Is(err, imageimport.ErrInvalid) {
		t.Errorf("kind: %v", err)
	}
	notNamed(t, "disk", big)

	_, err = im.Import(ctx, "disk", reg.Host+"/disk/expands:v1", nil)
	wantOneLine(t, "unpacks to 20 MiB", err, reg.Host+"/disk/expands:v1 unpacks to 2", "4.0 MiB of it kept by bex")
	notNamed(t, "disk", expands)

	if _, err := im.Import(ctx, "disk", reg.Host+"/disk/ok:v1", nil); err != nil {
		t.Fatalf("the ordinary image with the same disk: %v", err)
	}
}

// stallingProxy serves the registry at target, except that GETs of the blob
// digest send its headers and first 64 KiB and then nothing until the client
// goes; stalled is closed at the first such stall.
type stallingProxy struct {
	host    string
	stalled chan struct{}
	once    atomic.Bool
	stall   atomic.Bool
}

func startStallingProxy(t *testing.T, target, digest string) *stallingProxy {
	t.Helper()
	p := &stallingProxy{stalled: make(chan struct{})}
	p.stall.Store(true)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.host = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.stall.Load() || r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+digest) {
			rp.ServeHTTP(w, r)
			return
		}
		resp, err := http.Get("http://" + target + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		if _, err := io.CopyN(w, resp.Body, 64<<10); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		if p.once.CompareAndSwap(false, true) {
			close(p.stalled)
		}
		<-r.Context().Done()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p
}

// TestImportEndsWhenTheRegistryStalls: a registry (distribution's, behind a
// proxy) that stops sending in the middle of a 4 MiB layer ends the import
// after Config.StallTimeout (2 s here), with one line and nothing named; the
// same proxy, not stalling, serves the import.
func TestImportEndsWhenTheRegistryStalls(t *testing.T) {
	ctx := context.Background()
	reg := testregistry.Start(t, false)
	img := withRandomLayer(t, testregistry.ServingImage(t, busybox(t), "stall\n"), 4<<20)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := ls[len(ls)-1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref := testregistry.Push(t, reg.Host+"/stall/app:v1", img, "", "")
	proxy := startStallingProxy(t, reg.Host, ld.String())

	cfg := imageimport.DefaultConfig()
	cfg.StallTimeout = 2 * time.Second
	im := localImporter(t, cfg)
	start := time.Now()
	_, err = im.Import(ctx, "stall", proxy.host+"/stall/app:v1", nil)
	took := time.Since(start)
	select {
	case <-proxy.stalled:
	default:
		t.Fatalf("the proxy never stalled: %v", err)
	}
	wantOneLine(t, "a stalled blob", err, "pulling "+proxy.host+"/stall/app:v1 from "+proxy.host+" stopped: the registry sent nothing for 2s")
	t.Logf("the import ended %s after it began", took.Round(10*time.Millisecond))
	if took < 2*time.Second || took > 30*time.Second {
		t.Errorf("the import took %s with a stall timeout of 2s", took)
	}
	notNamed(t, "stall", ref)

	proxy.stall.Store(false)
	if _, err := im.Import(ctx, "stall", proxy.host+"/stall/app:v1", nil); err != nil {
		t.Fatalf("the same proxy, not stalling: %v", err)
	}
}

// TestImportStopsWhenTheDiskFillsDuringThePull: while a layer's pull waits
// on a slow registry, the disk (16 MiB, 4 MiB kept) is filled by someone
// else to under its margin: the import stops at once, with one line that
// says how low it went, not after the stall timeout (a minute here).
func TestImportStopsWhenTheDiskFillsDuringThePull(t *testing.T) {
	ctx := context.Background()
	reg := testregistry.Start(t, false)
	img := withRandomLayer(t, testregistry.ServingImage(t, busybox(t), "full\n"), 2<<20)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	ld, err := ls[len(ls)-1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref := testregistry.Push(t, reg.Host+"/full/app:v1", img, "", "")
	proxy := startStallingProxy(t, reg.Host, ld.String())

	cfg := imageimport.DefaultConfig()
	cfg.StallTimeout = time.Minute
	cfg.DiskDir, cfg.MinFreeBytes, cfg.MinFreePercent = smallDisk(t, "16m"), 4<<20, 100
	im := localImporter(t, cfg)
	filledAt := make(chan time.Time, 1)
	go func() {
		<-proxy.stalled
		now := time.Now()
		_ = os.WriteFile(filepath.Join(cfg.DiskDir, "other"), make([]byte, 13<<20), 0o600)
		filledAt <- now
	}()
	_, err = im.Import(ctx, "full", proxy.host+"/full/app:v1", nil)
	var took time.Duration
	select {
	case filled := <-filledAt:
		took = time.Since(filled)
	case <-time.After(10 * time.Second):
		t.Fatalf("the proxy never stalled, or the disk was not filled: %v", err)
	}
	wantOneLine(t, "the disk filled", err, "pulling "+proxy.host+"/full/app:v1 stopped: the disk of "+cfg.DiskDir+" fell to 3.", "MiB free, under the 4.0 MiB bex keeps")
	t.Logf("the import ended %s after the disk was filled", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("the import ended %s after the disk filled", took)
	}
	notNamed(t, "full", ref)
}
