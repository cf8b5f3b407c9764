package local

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// gateWriter holds a backup open: its first write says so on started and
// blocks until release is closed.
type gateWriter struct {
	buf      bytes.Buffer // not embedded: its ReadFrom would pass Write by
	once     sync.Once
	started  chan struct{}
	release  chan struct{}
	released time.Time // set by open
}

func newGateWriter() *gateWriter {
	return &gateWriter{started: make(chan struct{}), release: make(chan struct{})}
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.once.Do(func() {
		close(w.started)
		<-w.release
	})
	return w.buf.Write(p)
}

func (w *gateWriter) Bytes() []byte { return w.buf.Bytes() }

// open lets the backup go on.
func (w *gateWriter) open() {
	w.released = time.Now()
	close(w.release)
}

// backupHeld starts a backup of the fixture's volume "data" held open by a
// gateWriter, and returns it once the app's containers are paused and the first
// bytes are being written; the channel gets Backup's error.
func (f *fixture) backupHeld(vs *Volumes) (*gateWriter, <-chan error) {
	f.t.Helper()
	w := newGateWriter()
	errc := make(chan error, 1)
	go func() { errc <- vs.Backup(context.Background(), f.key(), "data", w) }()
	select {
	case <-w.started:
	case err := <-errc:
		f.t.Fatalf("backup: %v", err)
	case <-time.After(time.Minute):
		f.t.Fatal("the backup did not start writing within a minute")
	}
	f.t.Cleanup(func() {
		select {
		case <-w.release:
		default:
			w.open()
		}
	})
	return w, errc
}

type taskState struct {
	status containerd.ProcessStatus
	pid    uint32
	labels map[string]string
}

// deployWithData rolls out release 1 of v1 (and one web instance) with the
// volume "data" of 16 MiB, with d's changes, and returns it.
func (f *fixture) deployWithData(change func(*runtime.Desired)) runtime.Desired {
	f.t.Helper()
	vols := []appv1.Volume{dataVolume("16Mi")}
	f.app.Spec.Volumes = vols
	d := f.desired(1, f.v1, 1)
	d.Volumes = vols
	if change != nil {
		change(&d)
	}
	f.syncUntil(d, time.Minute, "release 1 with a volume", rolledOut)
	return d
}

// tasks maps the app's containers to their tasks' status and pid (those with a
// task).
func (f *fixture) tasks() map[string]taskState {
	f.t.Helper()
	cl, err := f.cd.Client()
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	ctx := namespaces.WithNamespace(context.Background(), f.cfg.Namespace)
	out := map[string]taskState{}
	for id, l := range f.containers() {
		ctr, err := cl.LoadContainer(ctx, id)
		if err != nil {
			continue
		}
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			continue
		}
		st, err := task.Status(ctx)
		if err != nil {
			continue
		}
		out[id] = taskState{st.Status, task.Pid(), l}
	}
	return out
}

func (f *fixture) logged(s string) int {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	return strings.Count(f.logs.String(), s)
}

// TestStartsWaitForAVolumeBackup holds a backup open while the deployer rolls out
// a new release (an instance start) and a one-off that writes into the volume
// starts: neither runs while the app is paused (no task that mounts the volume
// runs unpaused meanwhile, and both say they wait), the archive does not have the
// one-off's file, which is written after the backup let go; then both start.
func TestStartsWaitForAVolumeBackup(t *testing.T) {
	f := newFixture(t, "volume-startlock")
	var ooLog syncBuffer
	o, err := NewOneOffs(f.cfg, f.k8s, "test", slog.New(slog.NewTextHandler(&ooLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	d := f.deployWithData(nil)
	if exit, out := f.run(o, f.app, `echo before > `+volPath+`/before`); exit != 0 {
		t.Fatalf("write: %d %q", exit, out)
	}
	vs, err := NewVolumes(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()

	w, backupErr := f.backupHeld(vs)
	// A rollout (the new instance's start) and a one-off, during the backup.
	d2 := f.desired(2, f.v2, 1)
	d2.Volumes = d.Volumes
	if _, err := f.rt.Sync(context.Background(), d2); err != nil {
		t.Fatal(err)
	}
	type result struct {
		exit int
		out  string
	}
	ran := make(chan result, 1)
	go func() {
		oo := f.oneOff("sh", "-c", `echo during > `+volPath+`/oneoff && echo wrote`)
		var out syncBuffer
		oo.Stdout, oo.Stderr = &out, &out
		exit, err := o.Run(context.Background(), oo)
		if err != nil {
			out.Write([]byte(err.Error()))
		}
		ran <- result{exit, out.String()}
	}()
	dir := f.cfg.VolumeDir(f.key(), "data")
	const waiting = "waiting for the backup or restore of a volume to end before starting"
	testenv.Eventually(t, time.Minute, "the new instance and the one-off waiting for the backup", func() error {
		if _, err := os.Stat(filepath.Join(dir, "oneoff")); err == nil {
			t.Fatalf("the one-off wrote into the volume during its backup")
		}
		for id, tk := range f.tasks() {
			if labelHasVolume(tk.labels, "data") && tk.status != containerd.Paused {
				t.Fatalf("%s (%s) is %s during the volume's backup, want paused or not started", id, tk.labels[labelProcess], tk.status)
			}
		}
		if n := f.logged(waiting); n != 1 {
			return fmt.Errorf("the runtime logged %d waits", n)
		}
		if !strings.Contains(ooLog.String(), waiting) {
			return fmt.Errorf("the one-off has not said it waits")
		}
		return nil
	})
	w.open()
	if err := <-backupErr; err != nil {
		t.Fatal(err)
	}
	if names := tarNames(t, w.Bytes()); strings.Join(names, " ") != "before" {
		t.Fatalf("archive entries %q, want only the file written before the backup", names)
	}
	select {
	case r := <-ran:
		if r.exit != 0 || r.out != "wrote\n" {
			t.Fatalf("the one-off: exit %d, %q", r.exit, r.out)
		}
	case <-time.After(time.Minute):
		t.Fatal("the one-off did not run within a minute of the backup's end")
	}
	fi, err := os.Stat(filepath.Join(dir, "oneoff"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().After(w.released) {
		t.Fatalf("the one-off wrote at %v, before the backup was let go at %v", fi.ModTime(), w.released)
	}
	f.syncUntil(d2, time.Minute, "release 2 rolled out after the backup", func(st runtime.Status) bool { return st.RolledOut && st.Serving == 2 })
}

// TestHealthChecksWaitOutAVolumeBackup holds a backup open (the web instance
// frozen, its HTTP health check timing out) for more checks than restart an
// instance that stopped answering: it is neither killed nor replaced, and it
// answers again once the backup ends, with no restart counted.
func TestHealthChecksWaitOutAVolumeBackup(t *testing.T) {
	f := newFixture(t, "volume-health")
	f.rt.Close()
	f.cfg.LivenessInterval, f.cfg.LivenessFailures = 100*time.Millisecond, 2
	f.rt = f.newRuntime()
	d := f.deployWithData(func(d *runtime.Desired) { d.HealthCheck = &appv1.HealthCheck{Path: "/index.html"} })
	before := f.tasks()
	if len(before) != 1 {
		t.Fatalf("tasks %v", before)
	}
	vs, err := NewVolumes(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()

	w, backupErr := f.backupHeld(vs)
	const skipped = "health check not counted: the instance is paused"
	// More uncounted checks than LivenessFailures: without them, the instance
	// would have been killed after two.
	testenv.Eventually(t, time.Minute, "health checks of the frozen instance", func() error {
		st, err := f.rt.Sync(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Processes["web"].Restarts != 0 {
			t.Fatalf("the frozen instance was restarted during the backup: %+v", st)
		}
		for id, tk := range f.tasks() {
			if _, ok := before[id]; !ok || tk.status != containerd.Paused || tk.pid != before[id].pid {
				t.Fatalf("during the backup: %s %s pid %d, want %v paused", id, tk.status, tk.pid, before)
			}
		}
		if n := f.logged(skipped); n < f.cfg.LivenessFailures+2 {
			return fmt.Errorf("%d checks while paused", n)
		}
		return nil
	})
	w.open()
	if err := <-backupErr; err != nil {
		t.Fatal(err)
	}
	st := f.syncUntil(d, 30*time.Second, "the instance ready after the backup", func(st runtime.Status) bool { return st.Processes["web"].Ready == 1 })
	if st.Processes["web"].Restarts != 0 || st.Failure != "" {
		t.Fatalf("after the backup: %+v", st)
	}
	after := f.tasks()
	for id, tk := range after {
		if _, ok := before[id]; !ok || tk.status != containerd.Running || tk.pid != before[id].pid {
			t.Fatalf("after the backup: %s %s pid %d, want %v running", id, tk.status, tk.pid, before)
		}
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	f.mustGet(eps[0], "version v1")
}

// TestPausedContainerIsResumedWhenItsBackupWent pauses the app's instance as a
// backup does and lets the backup's process "die" (no lock held, or the lock
// let go): the deployer resumes the same task, not a new one; a restart of the
// deployer meanwhile adopts the paused task instead of replacing it, and leaves
// it paused while the backup's lock is held.
func TestPausedContainerIsResumedWhenItsBackupWent(t *testing.T) {
	f := newFixture(t, "volume-thaw")
	d := f.deployWithData(nil)
	before := f.tasks()
	if len(before) != 1 {
		t.Fatalf("tasks %v", before)
	}
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := namespaces.WithNamespace(context.Background(), f.cfg.Namespace)
	var task containerd.Task
	for id := range before {
		ctr, err := cl.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if task, err = ctr.Task(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	resumedSame := func(what string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, func() error {
			now := f.tasks()
			for id, tk := range now {
				if _, ok := before[id]; !ok || tk.pid != before[id].pid {
					t.Fatalf("%s: %s pid %d, want the same task as %v", what, id, tk.pid, before)
				}
				if tk.status != containerd.Running {
					return fmt.Errorf("%s is %s", id, tk.status)
				}
			}
			if len(now) != 1 {
				return fmt.Errorf("tasks %v", now)
			}
			return nil
		})
	}

	// Paused with no backup holding the volume: a leftover, resumed.
	if err := task.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	resumedSame("a paused instance whose backup went resumed")

	// Paused under the backup's lock, the deployer restarted meanwhile: adopted
	// as it is, resumed when the lock goes (its process died).
	unlock, err := f.cfg.lockVolume(f.key(), dataLockName("data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Pause(ctx); err != nil {
		unlock()
		t.Fatal(err)
	}
	f.rt.Close()
	f.rt = f.newRuntime()
	st, err := f.rt.Sync(context.Background(), d)
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	for id, tk := range f.tasks() {
		if tk.status != containerd.Paused || tk.pid != before[id].pid {
			unlock()
			t.Fatalf("adopted during a backup: %s %s pid %d (status %+v), want the same task paused", id, tk.status, tk.pid, st)
		}
	}
	unlock()
	resumedSame("an adopted paused instance resumed once the backup's lock went")
	st = f.syncUntil(d, 30*time.Second, "ready", func(st runtime.Status) bool { return st.Processes["web"].Ready == 1 })
	if st.Processes["web"].Restarts != 0 {
		t.Fatalf("restarted: %+v", st)
	}
}
