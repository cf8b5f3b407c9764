package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/volumearchive/archivetest"
)

// The test app's httpd serves /www, so a volume at /www/data is readable over
// HTTP from the web instance: what a one-off writes there, the instance shows.
const volPath = "/www/data"

func dataVolume(size string) appv1.Volume {
	return appv1.Volume{Name: "data", Path: volPath, Size: resource.MustParse(size)}
}

// run runs sh -c script in a one-off of app and returns its exit and output.
func (f *fixture) run(o *OneOffs, app *appv1.App, script string) (int, string) {
	f.t.Helper()
	oo := f.oneOff("sh", "-c", script)
	oo.App = app
	var out syncBuffer
	oo.Stdout, oo.Stderr = &out, &out
	exit, err := o.Run(context.Background(), oo)
	if err != nil {
		f.t.Fatalf("run %q: %v", script, err)
	}
	return exit, out.String()
}

// TestVolumeKeepsItsFilesAndIsBoundedAndPrivate writes a file into a volume from
// a one-off and reads it back through the web instance after a redeploy, a
// rollback, a suspend and resume, and a restart of the runtime with the volume
// unmounted meanwhile (a reboot); fills the volume past its size (ENOSPC inside,
// the runtime keeps serving, the host's disk gives nothing more); shows that
// another app with a volume of the same name sees none of it; and deletes it.
func TestVolumeKeepsItsFilesAndIsBoundedAndPrivate(t *testing.T) {
	f := newFixture(t, "volumes")
	o := f.newOneOffs()
	vols := []appv1.Volume{dataVolume("16Mi")}
	f.app.Spec.Volumes = vols // one-offs mount the App's volumes
	d := f.desired(1, f.v1, 1)
	d.Volumes = vols
	st := f.syncUntil(d, time.Minute, "release 1 with a volume", rolledOut)
	if len(st.Volumes) != 1 || st.Volumes[0] != (appv1.VolumeStatus{Name: "data", Ready: true}) {
		t.Fatalf("status.volumes %+v", st.Volumes)
	}
	dir := f.cfg.VolumeDir(f.key(), "data")

	exit, out := f.run(o, f.app, `echo kept > `+volPath+`/f && id -u && stat -c '%u %a' `+volPath)
	if exit != 0 || out != "0\n0 755\n" {
		t.Fatalf("write into the volume: exit %d, %q", exit, out)
	}
	var fst unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "f"), &fst); err != nil {
		t.Fatal(err)
	}
	hostID, _ := f.rt.store.knownIDs(f.key().String())
	if fst.Uid != hostID || hostID < f.rt.cfg.IDBase {
		t.Fatalf("the file is owned by host uid %d, want the app's %d", fst.Uid, hostID)
	}
	// The app's directory above the volume: root's, only the app's group passes.
	var ast unix.Stat_t
	if err := unix.Lstat(filepath.Dir(dir), &ast); err != nil {
		t.Fatal(err)
	}
	if ast.Uid != 0 || ast.Gid != hostID || ast.Mode&0o777 != 0o710 {
		t.Fatalf("%s: %d:%d mode %o, want 0:%d 0710", filepath.Dir(dir), ast.Uid, ast.Gid, ast.Mode&0o777, hostID)
	}

	served := func(what string) {
		t.Helper()
		eps := f.endpoints()
		if len(eps) != 1 {
			t.Fatalf("%s: endpoints %v", what, eps)
		}
		got, err := get(eps[0] + "/data/f")
		if err != nil || got != "kept" {
			t.Fatalf("%s: GET /data/f = %q, %v; want kept", what, got, err)
		}
	}
	served("release 1")

	d2 := f.desired(2, f.v2, 1)
	d2.Volumes = vols
	f.syncUntil(d2, time.Minute, "release 2 (a redeploy)", func(st runtime.Status) bool { return st.RolledOut && st.Serving == 2 })
	served("after a redeploy")

	d3 := f.desired(3, f.v1, 1) // a rollback: v1's image again, the same volumes
	d3.Volumes = vols
	f.syncUntil(d3, time.Minute, "release 3 (a rollback)", func(st runtime.Status) bool { return st.RolledOut && st.Serving == 3 })
	served("after a rollback")

	d3.Suspended = true
	f.syncUntil(d3, 30*time.Second, "suspended", rolledOut)
	if mounted, err := isMountPoint(dir); err != nil || !mounted {
		t.Fatalf("suspended: the volume is not mounted (%v)", err)
	}
	d3.Suspended = false
	f.syncUntil(d3, time.Minute, "resumed", rolledOut)
	served("after suspend and resume")

	// A restart of bex after a reboot: the runtime goes, the volume is
	// unmounted (the instance keeps its own mount, as a running container
	// would not after a reboot, so it is restarted below), a new runtime
	// mounts it again before it adopts anything.
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	f.rt = f.newRuntime()
	if mounted, err := isMountPoint(dir); err != nil || !mounted {
		t.Fatalf("after the restart: the volume is not mounted again (%v)", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "kept\n" {
		t.Fatalf("after the restart: %q, %v", b, err)
	}
	d3.Restarts = map[string]string{"web": "after-reboot"}
	f.syncUntil(d3, time.Minute, "restarted instance after the restart", rolledOut)
	served("after a restart of bex")

	// Full: ENOSPC inside, the app keeps serving, the image did not grow.
	var before unix.Stat_t
	img := f.cfg.volumeImage(f.key(), "data")
	if err := unix.Stat(img, &before); err != nil {
		t.Fatal(err)
	}
	exit, out = f.run(o, f.app, `dd if=/dev/zero of=`+volPath+`/big bs=1M count=64 2>&1; echo "exit $?"`)
	if !strings.Contains(out, "No space left on device") || strings.HasSuffix(out, "exit 0\n") || exit != 0 {
		t.Fatalf("writing 64 MiB into 16 MiB: exit %d, %q", exit, out)
	}
	var after unix.Stat_t
	if err := unix.Stat(img, &after); err != nil {
		t.Fatal(err)
	}
	// Fewer blocks than before can happen: ext4 zeroes parts of extents it
	// splits with a write-zeroes request, which the loop driver turns into a
	// hole in the image (seen once in a full run). More cannot.
	if after.Size != 16<<20 || after.Blocks*512 > before.Blocks*512 {
		t.Fatalf("the volume's image: %d bytes, %d allocated (before %d): want 16 MiB and no more blocks than it had", after.Size, after.Blocks*512, before.Blocks*512)
	}
	used, size, err := f.cfg.VolumeUsage(f.key(), "data")
	if err != nil || size > 16<<20 || used < size*9/10 {
		t.Fatalf("usage when full: used %d of %d, %v", used, size, err)
	}
	st = f.syncUntil(d3, 30*time.Second, "still rolled out with a full volume", rolledOut)
	// A size asked for later is said, not applied.
	bigger := d3
	bigger.Volumes = []appv1.Volume{dataVolume("32Mi")}
	if st, err := f.rt.Sync(context.Background(), bigger); err != nil || len(st.Volumes) != 1 || !st.Volumes[0].Ready ||
		!strings.Contains(st.Volumes[0].Message, "its size is 16 MiB, fixed when it was made (the spec asks for 32Mi)") {
		t.Fatalf("a bigger size in the spec: %+v, %v", st.Volumes, err)
	}
	served("with the volume full")
	if exit, out := f.run(o, f.app, `rm `+volPath+`/big && echo more > `+volPath+`/g && cat `+volPath+`/g`); exit != 0 || out != "more\n" {
		t.Fatalf("after freeing space: exit %d, %q", exit, out)
	}

	// Another app, with a volume of the same name and path: its own, empty.
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.app.Namespace, UID: "other-uid"}}
	other.Spec.Volumes = vols
	otherKey := types.NamespacedName{Namespace: other.Namespace, Name: other.Name}
	t.Cleanup(func() { _ = f.rt.Delete(context.Background(), otherKey) })
	od := runtime.Desired{App: other, Release: 1, Image: f.v1, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}, Volumes: vols}
	f.rt.Sync(context.Background(), od)
	testenv.Eventually(t, time.Minute, "the other app rolled out", func() error {
		st, err := f.rt.Sync(context.Background(), od)
		if err != nil || !st.RolledOut {
			return fmt.Errorf("%+v, %v", st, err)
		}
		return nil
	})
	exit, out = f.run(o, other, `ls -A `+volPath+`; cat `+volPath+`/f; ls /run/bex 2>&1; echo done`)
	// stdout and stderr interleave in any order.
	if exit != 0 || strings.Contains(out, "kept") || !strings.Contains(out, "can't open '"+volPath+"/f': No such file") || !strings.Contains(out, "done\n") {
		t.Fatalf("the other app's view: exit %d, %q", exit, out)
	}
	if strings.Contains(out, "\nf\n") || strings.HasPrefix(out, "f\n") {
		t.Fatalf("the other app lists shop's file: %q", out)
	}
	otherID, _ := f.rt.store.knownIDs(otherKey.String())
	if otherID == hostID {
		t.Fatalf("both apps have the host ids %d", hostID)
	}

	// Removed from the list: deleted once nothing has it, data and all.
	d3.Volumes = nil
	testenv.Eventually(t, time.Minute, "the volume deleted", func() error {
		st, err := f.rt.Sync(context.Background(), d3)
		if err != nil {
			return err
		}
		if !st.RolledOut || len(st.Volumes) != 0 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if _, err := os.Stat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the image is still there: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the mount point is still there: %v", err)
	}
	// The other app's volume is its own and stays.
	if _, _, err := f.cfg.VolumeUsage(otherKey, "data"); err != nil {
		t.Fatalf("the other app's volume: %v", err)
	}
	if err := f.rt.Delete(context.Background(), otherKey); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.cfg.volumeImageDir(otherKey)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a deleted app's volumes are still there: %v", err)
	}
}

// TestVolumeBackupDestroyCreateRestore backs a volume up while the app's
// instance runs (paused during the copy), destroys it, makes it again and
// restores the archive: the same bytes, modes, owners and links. Then each kind
// of hostile archive is refused and leaves the volume exactly as it was, and
// nothing outside it is written.
func TestVolumeBackupDestroyCreateRestore(t *testing.T) {
	f := newFixture(t, "volume-backup")
	o := f.newOneOffs()
	vols := []appv1.Volume{dataVolume("32Mi")}
	f.app.Spec.Volumes = vols
	d := f.desired(1, f.v1, 1)
	d.Volumes = vols
	f.syncUntil(d, time.Minute, "release 1 with a volume", rolledOut)
	dir := f.cfg.VolumeDir(f.key(), "data")
	hostID, _ := f.rt.store.knownIDs(f.key().String())

	exit, out := f.run(o, f.app, `set -e; cd `+volPath+`
mkdir -p sub/deep && echo one > sub/deep/a && printf 'two\0bytes' > b
head -c 300000 /dev/urandom > random.bin
ln -s sub/deep/a rel-link && ln -s /etc/passwd abs-link && ln b hard
chown 1000:1001 b && chmod 640 b && chmod 711 sub && mkfifo sub/fifo && echo ok`)
	if exit != 0 || out != "ok\n" {
		t.Fatalf("fill the volume: exit %d, %q", exit, out)
	}
	want := archivetest.Tree(t, dir, hostID)
	delete(want, "sub/fifo") // not data: backups leave fifos and sockets out

	vs, err := NewVolumes(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	ctx := context.Background()

	// The instance is paused while the archive is written.
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var web containerd.Task
	for id := range f.containers() {
		ctr, err := cl.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if web, err = ctr.Task(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if web == nil {
		t.Fatal("no instance")
	}
	backup := &pausedWriter{task: web, ctx: namespaces.WithNamespace(ctx, f.cfg.Namespace)}
	if err := vs.Backup(ctx, f.key(), "data", backup); err != nil {
		t.Fatal(err)
	}
	if backup.status != containerd.Paused {
		t.Fatalf("the instance was %q while its volume was read, want paused", backup.status)
	}
	if st, err := web.Status(backup.ctx); err != nil || st.Status != containerd.Running {
		t.Fatalf("the instance after the backup: %v, %v", st.Status, err)
	}
	names := tarNames(t, backup.Bytes())
	if strings.Join(names, " ") != "abs-link b hard random.bin rel-link sub/ sub/deep/ sub/deep/a" {
		t.Fatalf("archive entries %q", names)
	}

	// destroy → create → restore
	d.Volumes = nil
	f.app.Spec.Volumes = nil
	f.syncUntil(d, time.Minute, "the volume destroyed", func(st runtime.Status) bool { return st.RolledOut && len(st.Volumes) == 0 })
	d.Volumes = vols
	f.app.Spec.Volumes = vols
	f.syncUntil(d, time.Minute, "the volume made again", func(st runtime.Status) bool { return st.RolledOut && len(st.Volumes) == 1 })
	if got := archivetest.Tree(t, dir, hostID); len(got) != 0 {
		t.Fatalf("a volume made again is not empty: %v", got)
	}
	if err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	got := archivetest.Tree(t, dir, hostID)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored:\n%v\nwant:\n%v", got, want)
	}
	// A backup of the restored volume is the same bytes: names, ids, modes,
	// modification times (directories' too), links and contents.
	var again bytes.Buffer
	if err := vs.Backup(ctx, f.key(), "data", &again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), backup.Bytes()) {
		t.Fatalf("the backup of the restored volume differs from the one restored:\n%s\nwant:\n%s", tarHeaders(again.Bytes()), tarHeaders(backup.Bytes()))
	}
	if exit, out := f.run(o, f.app, `cat `+volPath+`/rel-link && stat -c '%u:%g %a' `+volPath+`/b`); exit != 0 || out != "one\n1000:1001 640\n" {
		t.Fatalf("the app's view of the restore: exit %d, %q", exit, out)
	}

	outside := t.TempDir()
	hostile := archivetest.Hostiles(t, outside, backup.Bytes())
	for _, h := range hostile {
		err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(h.Tar))
		if err == nil || !errors.Is(err, ErrBadArchive) {
			t.Errorf("%s: Restore = %v, want a refusal (ErrBadArchive)", h.Name, err)
		}
		if got := archivetest.Tree(t, dir, hostID); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the volume changed:\n%v\nwant:\n%v", h.Name, got, want)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Errorf("%s: written outside the volume: %v", h.Name, ents)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("written beside the volume: %v", err)
	}
	// An archive bigger than the volume: refused by the volume's size, the
	// volume as it was.
	big := archivetest.TarOf(t, tar.Header{Name: "big", Typeflag: tar.TypeReg, Linkname: strings.Repeat("z", 40<<20)})
	if err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(big)); !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "the volume is full") {
		t.Errorf("a 40 MiB archive into 32 MiB: %v", err)
	}
	if got := archivetest.Tree(t, dir, hostID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the archive too big: the volume changed")
	}
	// A tar bomb of empty files: bounded by the volume's inodes (a 32 MiB ext4
	// has 8192), refused, the volume as it was.
	var bomb bytes.Buffer
	tw := tar.NewWriter(&bomb)
	for i := range 20000 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%d/f%d", i/1000, i), Mode: 0o644, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(bomb.Bytes())); !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "the volume is full") {
		t.Errorf("20000 files into 32 MiB: %v", err)
	}
	if got := archivetest.Tree(t, dir, hostID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the tar bomb: the volume changed")
	}
}

// pausedWriter records the task's status at the first write.
type pausedWriter struct {
	bytes.Buffer
	task   containerd.Task
	ctx    context.Context
	status containerd.ProcessStatus
}

func (w *pausedWriter) Write(p []byte) (int, error) {
	if w.status == "" {
		st, err := w.task.Status(w.ctx)
		if err != nil {
			return 0, err
		}
		w.status = st.Status
	}
	return w.Buffer.Write(p)
}

// tarHeaders shows an archive's headers, one a line.
func tarHeaders(b []byte) string {
	tr := tar.NewReader(bytes.NewReader(b))
	var out []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		out = append(out, fmt.Sprintf("%s %c %o %d:%d %d %s %s %v", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size, h.Linkname, h.ModTime.Format(time.RFC3339Nano), h.PAXRecords))
	}
	return strings.Join(out, "\n")
}

func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

// TestRolloutWithAVolumeKeepsServing: on one machine a rollout of an app with a
// volume stays zero-downtime (the new instance is ready beside the old one, both
// mounting the same file system): every request, made as the edge makes them,
// gets the volume's file from the first release to the second.
func TestRolloutWithAVolumeKeepsServing(t *testing.T) {
	f := newFixture(t, "volume-rollout")
	o := f.newOneOffs()
	vols := []appv1.Volume{dataVolume("16Mi")}
	f.app.Spec.Volumes = vols
	d := f.desired(1, f.v1, 1)
	d.Volumes = vols
	f.syncUntil(d, time.Minute, "release 1 with a volume", rolledOut)
	if exit, out := f.run(o, f.app, `echo kept > `+volPath+`/f`); exit != 0 {
		t.Fatalf("write: %d %q", exit, out)
	}

	var (
		mu              sync.Mutex
		answers, failed int
		failures        []string
		bothMounted     bool
		stop, done      = make(chan struct{}), make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			urls, err := readEndpoints(f.k8s, f.key())
			var body string
			if err == nil && len(urls) == 0 {
				err = fmt.Errorf("no ready endpoint")
			}
			if err == nil {
				body, err = get(urls[i%len(urls)] + "/data/f")
			}
			mu.Lock()
			if err != nil || body != "kept" {
				failed++
				failures = append(failures, fmt.Sprintf("%q %v", body, err))
			} else {
				answers++
			}
			mu.Unlock()
		}
	}()
	d2 := f.desired(2, f.v2, 1)
	d2.Volumes = vols
	testenv.Eventually(t, time.Minute, "release 2 rolled out", func() error {
		st, err := f.rt.Sync(context.Background(), d2)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range f.containers() {
			if labelHasVolume(l, "data") {
				n++
			}
		}
		if n == 2 {
			bothMounted = true
		}
		if !st.RolledOut || st.Serving != 2 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "the old instance to stop", f.containersAre(1))
	close(stop)
	<-done

	// --process: a volume for web only is not in worker's instances (nor in
	// its config: a worker instance sees no /www/data mount).
	d3 := f.desired(3, f.v2, 1)
	d3.Processes["worker"] = appv1.ProcessSpec{Replicas: 1}
	d3.Volumes = []appv1.Volume{{Name: "data", Path: volPath, Size: resource.MustParse("16Mi"), Processes: []string{"web"}}}
	f.syncUntil(d3, time.Minute, "release 3 with a worker", rolledOut)
	testenv.Eventually(t, 30*time.Second, "release 2's instance to stop", f.containersAre(2))
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := namespaces.WithNamespace(context.Background(), f.cfg.Namespace)
	for id, l := range f.containers() {
		want := map[string]string{"web": "data", "worker": ""}[l[labelProcess]]
		ctr, err := cl.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := ctr.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mounted := false
		for _, m := range spec.Mounts {
			if m.Destination == volPath {
				mounted = m.Source == f.cfg.VolumeDir(f.key(), "data")
			}
		}
		if l[labelVolumes] != want || mounted != (want != "") {
			t.Errorf("%s (%s): label %q, mounted %v; want %q", id, l[labelProcess], l[labelVolumes], mounted, want)
		}
	}
	if failed > 0 || answers < 10 {
		t.Fatalf("%d answers, %d failed during the rollout: %v", answers, failed, failures)
	}
	if !bothMounted {
		t.Fatalf("the old and the new instance never had the volume at once: the rollout was not overlapping")
	}
	t.Logf("%d requests during the rollout, all answered with the volume's file", answers)
}
