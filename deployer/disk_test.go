package deployer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/machine/imagebuild"
	"bex.co/bex/internal/testenv"
)

// appImages makes images of a runnable app as a build would leave them in
// containerd: FROM busybox (the very layer blob of the busybox base, so that
// content and the unpacked snapshot are shared with it, as BuildKit shares
// them) plus a layer of the app's own files, distinct per release (a page
// saying the release and payload bytes of random data, so that the layer is as
// big compressed as it is on disk), named <repo>:<commit> the way the builder
// names them, and unpacked for overlayfs.
type appImages struct {
	t       testing.TB
	cd      *testenv.Containerd
	repo    string
	payload int
	base    []byte // the busybox layer, compressed, as stored
	// unpacked is the size of the busybox layer's tar: about what one
	// unpacked copy of the base takes on disk.
	unpacked int64
}

func newAppImages(t testing.TB, cd *testenv.Containerd, repo string, payload int) *appImages {
	t.Helper()
	testenv.SharedBusybox(t)
	cl, err := cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	img, err := cl.ImageService().Get(ctx, baseimage.BusyboxRef)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cimages.Manifest(ctx, cl.ContentStore(), img.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 {
		t.Fatalf("busybox has %d layers", len(m.Layers))
	}
	base, err := content.ReadBlob(ctx, cl.ContentStore(), m.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(base))
	if err != nil {
		t.Fatal(err)
	}
	unpacked, err := io.Copy(io.Discard, zr)
	if err != nil {
		t.Fatal(err)
	}
	return &appImages{t: t, cd: cd, repo: repo, payload: payload, base: base, unpacked: unpacked}
}

// make imports release i's image and returns its digest reference, as the
// builder hands it to the deployer.
func (a *appImages) make(i int) string {
	a.t.Helper()
	var files bytes.Buffer
	tw := tar.NewWriter(&files)
	p := make([]byte, a.payload)
	r := rand.New(rand.NewPCG(uint64(i), 7))
	for j := range p {
		p[j] = byte(r.Uint32())
	}
	page := fmt.Appendf(nil, "release %d\n", i)
	for _, f := range []struct {
		name string
		data []byte
	}{{"www/index.html", page}, {"www/payload", p}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			a.t.Fatal(err)
		}
		tw.Write(f.data)
	}
	tw.Close()
	open := func(b []byte) tarball.Opener {
		return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	base, err := tarball.LayerFromOpener(open(a.base))
	if err != nil {
		a.t.Fatal(err)
	}
	own, err := tarball.LayerFromOpener(open(files.Bytes()))
	if err != nil {
		a.t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, base, own)
	if err != nil {
		a.t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", platforms.DefaultSpec().Architecture
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"sh", "-c", "exec httpd -f -p $PORT -h /www"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		a.t.Fatal(err)
	}
	name := fmt.Sprintf("%s:%012x", a.repo, i) // <repo>:<commit[:12]>
	dir := a.t.TempDir()
	dgst, err := imagebuild.WriteLayout(filepath.Join(dir, "oci"), img, map[string]string{"io.containerd.image.name": name})
	if err != nil {
		a.t.Fatal(err)
	}
	archive, err := baseimage.TarDir(filepath.Join(dir, "oci"))
	if err != nil {
		a.t.Fatal(err)
	}
	os.RemoveAll(dir)
	cl, err := a.cd.Client()
	if err != nil {
		a.t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	imgs, err := cl.Import(ctx, bytes.NewReader(archive))
	if err != nil || len(imgs) != 1 || imgs[0].Name != name {
		a.t.Fatalf("import %s: %v, %v", name, imgs, err)
	}
	if err := containerd.NewImage(cl, imgs[0]).Unpack(ctx, "overlayfs"); err != nil {
		a.t.Fatal(err)
	}
	return a.repo + "@" + dgst
}

// rootBytes is the disk containerd's root uses for content and snapshots: the
// blocks allocated to its files, each inode counted once (hard links, the
// content store's ingest links), files that go while it walks skipped.
func rootBytes(t testing.TB, root string) int64 {
	t.Helper()
	var n int64
	seen := map[uint64]bool{}
	for _, dir := range []string{"io.containerd.content.v1.content", "io.containerd.snapshotter.v1.overlayfs"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			info, err := d.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok || seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
			n += st.Blocks * 512
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// dirBytes is the apparent size of the files under dir.
func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// imageCounter counts, every few milliseconds until stopped, the images named
// under prefix, and keeps the most it saw: what containerd holds at any moment
// of a rollout, not only after it.
type imageCounter struct {
	mu   sync.Mutex
	most int
	stop chan struct{}
	done chan struct{}
}

func countImages(t testing.TB, cd *testenv.Containerd, prefix string) *imageCounter {
	t.Helper()
	cl, err := cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	c := &imageCounter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer cl.Close()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if imgs, err := cl.ImageService().List(context.Background(), fmt.Sprintf("name~=%q", "^"+prefix)); err == nil {
				c.mu.Lock()
				c.most = max(c.most, len(imgs))
				c.mu.Unlock()
			}
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return c
}

func (c *imageCounter) max() int {
	close(c.stop)
	<-c.done
	return c.most
}

// diskEnv is the real reconciler with the real local runtime on the shared
// containerd: rollouts start containers (user namespace, own network
// namespace, busybox httpd answering on PORT), and pruning removes images.
type diskEnv struct {
	*env
	cd       *testenv.Containerd
	rt       *local.Runtime
	stateDir string
	images   *appImages
}

func startDisk(t testing.TB, app string, keep, payload int) *diskEnv {
	t.Helper()
	cd := testenv.SharedContainerd(t)
	cp := testenv.SharedControlPlane(t)
	d := &diskEnv{cd: cd, stateDir: t.TempDir()}
	cfg := local.Config{Address: cd.Address, Namespace: testenv.Namespace, StateDir: d.stateDir, PortMin: 27000, PortMax: 27199,
		// busybox httpd as PID 1 ignores SIGTERM: the stop timeout is the SIGKILL.
		Drain: 100 * time.Millisecond, StopTimeout: 300 * time.Millisecond, BootTimeout: 20 * time.Second}
	rt, err := local.New(cfg, cp.Client, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.rt = rt
	t.Cleanup(func() {
		// The instances go before the runtime closes (Close leaves them running
		// for the next bex to adopt), and so do their network namespaces, which
		// live in the state dir.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if d.env == nil {
			rt.Close()
			return
		}
		if err := rt.Delete(ctx, types.NamespacedName{Namespace: d.ns, Name: app}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		rt.Close()
	})
	rcfg := DefaultConfig()
	rcfg.KeepReleases, rcfg.ImageRepo = keep, "bex.local"
	d.env = startWith(t, rcfg, func(*fakeRuntime) runtime.Runtime { return rt })
	d.create(app)
	d.images = newAppImages(t, cd, "bex.local/"+app, payload)
	return d
}

// deploy records release i of app with its own image, as a push does, and waits
// until it serves.
func (d *diskEnv) deploy(app string, i int) string {
	d.t.Helper()
	ref := d.images.make(i)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := d.rec.Record(ctx, app, releases.Change{Image: ref, Cause: appv1.ReleaseCausePush, Processes: map[string][]string{"web": nil}})
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.rec.Wait(ctx, app, n, nil); err != nil {
		d.t.Fatalf("release %d: %v", i, err)
	}
	return ref
}

// settle waits until the app runs one container (the drained instances of the
// releases before are deleted), then makes containerd collect its garbage now,
// by a synchronous delete of an image of its own in a namespace of its own (the
// collector is global): what an instance held and the next collection would
// free is then gone, and a measure does not depend on when that is.
func (d *diskEnv) settle(app string) {
	d.t.Helper()
	cl, err := d.cd.Client()
	if err != nil {
		d.t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	d.eventually("one container left", func() error {
		ctrs, err := cl.Containers(ctx, fmt.Sprintf("labels.%q==%s", appv1.LabelApp, app))
		if err != nil {
			return err
		}
		if len(ctrs) != 1 {
			return fmt.Errorf("%d containers", len(ctrs))
		}
		return nil
	})
	d.collect()
}

// collect makes containerd collect its garbage now.
func (d *diskEnv) collect() {
	d.t.Helper()
	cl, err := d.cd.Client()
	if err != nil {
		d.t.Fatal(err)
	}
	defer cl.Close()
	probe := namespaces.WithNamespace(context.Background(), "bex-gc-probe")
	if _, err := testenv.ImportTinyImage(probe, d.cd, "probe:1", []byte("probe")); err != nil {
		d.t.Fatal(err)
	}
	if err := cl.ImageService().Delete(probe, "probe:1", cimages.SynchronousDelete()); err != nil {
		d.t.Fatal(err)
	}
}

// waitImages waits until containerd holds n images of the app: the release
// pruned after a rollout took its image.
func (d *diskEnv) waitImages(app string, n int) {
	d.t.Helper()
	d.eventually(fmt.Sprintf("%d images of %s", n, app), func() error {
		if got := names(d.t, d.cd, testenv.Namespace, "bex.local/"+app+":"); len(got) != n {
			return fmt.Errorf("images %v", got)
		}
		return nil
	})
}

// names lists the images named under prefix in containerd's namespace ns.
func names(t testing.TB, cd *testenv.Containerd, ns, prefix string) []string {
	t.Helper()
	cl, err := cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	imgs, err := cl.ImageService().List(namespaces.WithNamespace(context.Background(), ns))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, i := range imgs {
		if strings.HasPrefix(i.Name, prefix) {
			out = append(out, i.Name)
		}
	}
	sort.Strings(out)
	return out
}

// 30 deploys of an app with KeepReleases 5, each its own image and a real
// rollout on the local runtime: containerd never holds more than 5 of the
// app's images, 6 while a rollout runs (the new one starting, the old one
// serving), and the bytes of containerd's content and snapshots after deploy
// 30 are those after deploy 10 (within less than one image): they level off
// instead of growing by an image per deploy. Each is measured settled: the
// drained instance gone and containerd's collection run (settle), since the
// runtime's chowned copy of a drained instance's image otherwise waits for the
// next collection (the next prune's synchronous delete), which would move a
// sample by a copy or two. The busybox base, an image of another name and an
// image of the same name in another namespace are untouched.
func TestThirtyDeploysLevelOff(t *testing.T) {
	const keep, deploys, payload = 5, 30, 512 << 10
	d := startDisk(t, "gc", keep, payload)
	ctx := context.Background()
	// The controls.
	otherNS := namespaces.WithNamespace(ctx, "bex-other")
	if _, err := testenv.ImportTinyImage(otherNS, d.cd, "bex.local/gc:000000000001", []byte("another namespace")); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.ImportTinyImage(ctx, d.cd, "bex.local/gc-2:000000000001", []byte("another app")); err != nil {
		t.Fatal(err)
	}
	counter := countImages(t, d.cd, "bex.local/gc:")
	start := time.Now()
	bytesAt := map[int]int64{}
	var line []string
	for i := 1; i <= deploys; i++ {
		d.deploy("gc", i)
		// The Release beyond keep is pruned once the rollout is done: its image
		// goes with it.
		d.waitImages("gc", min(i, keep))
		d.settle("gc")
		bytesAt[i] = rootBytes(t, d.cd.Root)
		line = append(line, fmt.Sprintf("%d:%.1f", i, float64(bytesAt[i])/(1<<20)))
	}
	took := time.Since(start)
	most := counter.max()
	t.Logf("%d deploys in %s (%.1fs each); at most %d images of the app at once; containerd content+snapshots MiB after each deploy: %s; runtime state dir %d bytes",
		deploys, took.Round(time.Second), took.Seconds()/deploys, most, strings.Join(line, " "), dirBytes(t, d.stateDir))
	if most > keep+1 {
		t.Errorf("%d images of the app at once, want at most %d", most, keep+1)
	}
	// Each deploy adds an image: its compressed layer in the content store and
	// its unpacked snapshot, about 2 × payload, plus, while an instance runs
	// it, the runtime's copy of it chowned into the app's ids. Had images
	// stayed, deploy 30 would be 20 images (at least 20 MiB) above deploy 10.
	// Measured settled (settle), the level is the same after every deploy from
	// the sixth on; allowed: less than one image, for the metadata files that
	// containerd's directories grow by.
	tolerance := int64(payload)
	t.Logf("bytes after deploy 10: %.2f MiB; after deploy %d: %.2f MiB", float64(bytesAt[10])/(1<<20), deploys, float64(bytesAt[deploys])/(1<<20))
	for i := 11; i <= deploys; i++ {
		if bytesAt[i] > bytesAt[10]+tolerance {
			t.Errorf("containerd holds %d bytes after deploy %d, %d after deploy 10: more than %d above, it does not level off", bytesAt[i], i, bytesAt[10], tolerance)
		}
	}
	for ns, want := range map[string][]string{
		testenv.Namespace: {baseimage.BusyboxRef},
		"bex-other":       {"bex.local/gc:000000000001"},
	} {
		for _, n := range want {
			if got := names(t, d.cd, ns, n); len(got) != 1 {
				t.Errorf("%s in namespace %s was removed", n, ns)
			}
		}
	}
	if got := names(t, d.cd, testenv.Namespace, "bex.local/gc-2:"); len(got) != 1 {
		t.Errorf("the other app's image: %v", got)
	}
}

// apps:destroy deletes the App; the deployer's finalizer then stops its
// instances and removes every image named under <image-repo>/<app> — those of
// its releases and a build that never became one — with their content and
// snapshots: containerd's bytes return to what they were before the app. The
// busybox base, another app's image and the same name in another namespace
// stay.
func TestDestroyedAppTakesItsImages(t *testing.T) {
	const payload = 256 << 10
	d := startDisk(t, "gone", 5, payload)
	ctx := context.Background()
	otherNS := namespaces.WithNamespace(ctx, "bex-other")
	if _, err := testenv.ImportTinyImage(otherNS, d.cd, "bex.local/gone:000000000001", []byte("another namespace")); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.ImportTinyImage(ctx, d.cd, "bex.local/gone-2:000000000001", []byte("another app")); err != nil {
		t.Fatal(err)
	}
	before := rootBytes(t, d.cd.Root)
	for i := 1; i <= 3; i++ {
		d.deploy("gone", i)
	}
	d.images.make(99) // a build whose release was never made (it failed, say)
	if got := names(t, d.cd, testenv.Namespace, "bex.local/gone:"); len(got) != 4 {
		t.Fatalf("before the destroy: %v", got)
	}
	full := rootBytes(t, d.cd.Root)
	if err := d.c.Delete(ctx, d.app("gone")); err != nil {
		t.Fatal(err)
	}
	d.eventually("the App is gone", func() error {
		err := d.c.Get(ctx, types.NamespacedName{Namespace: d.ns, Name: "gone"}, &appv1.App{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	if got := names(t, d.cd, testenv.Namespace, "bex.local/gone:"); len(got) != 0 {
		t.Errorf("images left after the app was destroyed: %v", got)
	}
	after := rootBytes(t, d.cd.Root)
	t.Logf("containerd content+snapshots: %d KiB before the app, %d KiB with 3 releases and a build, %d KiB after the destroy", before>>10, full>>10, after>>10)
	// What is left is what was there before, give or take the directories
	// containerd keeps (a few KiB).
	if after > before+payload/4 {
		t.Errorf("containerd holds %d bytes after the destroy, %d before the app: its images' content or snapshots stayed", after, before)
	}
	for ns, n := range map[string]string{testenv.Namespace: baseimage.BusyboxRef, "bex-other": "bex.local/gone:000000000001"} {
		if got := names(t, d.cd, ns, n); len(got) != 1 {
			t.Errorf("%s in namespace %s was removed", n, ns)
		}
	}
	if got := names(t, d.cd, testenv.Namespace, "bex.local/gone-2:"); len(got) != 1 {
		t.Errorf("the other app's image: %v", got)
	}
}
