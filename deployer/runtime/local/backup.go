package local

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"k8s.io/apimachinery/pkg/types"

	"bex.co/bex/internal/volumearchive"
)

// Volumes reads and replaces the contents of an app's volumes on this machine:
// their usage, and backups as tar streams (volumes:backup, volumes:restore). The
// gitserver uses it; the deployer makes and mounts the volumes.
//
// Consistency: the app's containers that mount the volume (instances and
// one-offs) are paused (containerd's task Pause: the cgroup freezer) while the
// archive is read or written, and resumed after, so a backup is one moment of
// the volume, and a restore is never seen half done. A paused instance answers
// nothing meanwhile.
//
// Starts: a backup or restore holds the volume's data lock (the flock of
// <name>.data.lock beside its image) exclusively while it pauses, copies and
// resumes; the start of an instance or one-off that mounts the volume, by the
// deployer or the gitserver, holds it shared from the task's creation until it
// runs (volumelock.go). So a start during a backup waits for its end (it says
// so in its process's log), and a backup that begins during a start finds the
// task running and pauses it. The bound: a backup or restore is cancelled after
// Config.VolumeTransferTimeout (default 1h), even with its stream stalled, its
// containers resumed (a cancelled restore leaves the volume as it was); a start
// waits at most that and a minute, then fails (an instance's supervisor tries
// again). The deployer's health checks do not count checks that fail while the
// task is paused. Should the gitserver die mid-backup, the kernel drops its
// lock but its containers stay frozen: the deployer resumes a task that is
// paused with nobody holding its volumes' data locks (it watches containerd's
// TaskPaused events, and the tasks it adopts or health-checks paused).
//
// The host side never follows a link out of the volume: every path is opened
// through an os.Root of the mounted volume, and a restore refuses, before it
// writes anything that stays, an archive with an absolute name, a '..'
// segment, a path through a symbolic link, a hard link out of it, a device
// node, or that is not a well-formed tar. It extracts into a staging directory
// inside the volume and swaps it in at the end, so a refused archive leaves the
// volume as it was, and the volume's size bounds what an archive can write.
type Volumes struct {
	cfg Config
	cd  *containerd.Client
	log *slog.Logger
}

// NewVolumes connects to containerd (to pause the app's containers) with cfg,
// the deployer's runtime Config.
func NewVolumes(cfg Config, log *slog.Logger) (*Volumes, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("local volumes: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	cd, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("local volumes: cannot reach containerd at %s: %w", cfg.Address, err)
	}
	return &Volumes{cfg: cfg, cd: cd, log: log.With("component", "runtime/local/volumes")}, nil
}

// Close closes the containerd connection.
func (v *Volumes) Close() error { return v.cd.Close() }

// Usage is the volume's bytes in use and its size; an error wrapping
// os.ErrNotExist when it is not mounted on this machine.
func (v *Volumes) Usage(key types.NamespacedName, name string) (used, size int64, err error) {
	return v.cfg.VolumeUsage(key, name)
}

// ErrBadArchive is wrapped by Restore's errors about the archive itself (as
// opposed to failures of the machine): the sender can fix those.
var ErrBadArchive = volumearchive.ErrBadArchive

// recordedIDs reads the app's first host id from the state file, where the
// runtime recorded its range (state.json "ids") when it first ran the app: the
// ids of an archive are relative to it. Never the owner of the volume's root:
// the app may chown its root to any id of its range, and a base taken from it
// would shift a restore's ids, up to 65535 of them into the next app's range.
func (v *Volumes) recordedIDs(key types.NamespacedName) (uint32, error) {
	st, err := openStore(filepath.Join(v.cfg.StateDir, "state.json"), v.cfg.PortMin, v.cfg.PortMax, v.cfg.IDBase, v.cfg.IDRanges)
	if err != nil {
		return 0, err
	}
	base, ok := st.knownIDs(key.String())
	if !ok {
		return 0, fmt.Errorf("app %s has no uid range recorded on this machine: its volumes cannot be read or written until it runs here", key.Name)
	}
	return base, nil
}

// open returns the mounted volume as a Root, and the app's first host id.
func (v *Volumes) open(key types.NamespacedName, name string) (*os.Root, uint32, error) {
	if !volumeNameOK(name) {
		return nil, 0, fmt.Errorf("volume %q: %w", name, os.ErrNotExist)
	}
	dir := v.cfg.VolumeDir(key, name)
	if ok, err := isMountPoint(dir); err != nil || !ok {
		return nil, 0, fmt.Errorf("volume %s of %s is not mounted on this machine: %w", name, key.Name, os.ErrNotExist)
	}
	base, err := v.recordedIDs(key)
	if err != nil {
		return nil, 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, 0, err
	}
	return root, base, nil
}

// lockData makes the backups and restores of one volume take turns, on this
// machine, across processes (its own lock file: the deployer's lock of the volume
// is not held for the length of a transfer).
func (v *Volumes) lockData(key types.NamespacedName, name string) (unlock func(), err error) {
	return v.cfg.lockVolume(key, name+".data")
}

// pause pauses the running tasks of the app's containers that mount the
// volume, and returns what resumes them.
func (v *Volumes) pause(ctx context.Context, key types.NamespacedName, name string) (resume func(), err error) {
	ctx = namespaces.WithNamespace(ctx, v.cfg.Namespace)
	ctrs, err := v.cd.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelNamespace, key.Namespace, labelApp, key.Name))
	if err != nil {
		return nil, fmt.Errorf("list containers of %s: %w", key, err)
	}
	var paused []containerd.Task
	resume = func() {
		rctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), v.cfg.Namespace), 30*time.Second)
		defer cancel()
		for _, t := range paused {
			if err := t.Resume(rctx); err != nil {
				v.log.Warn("resume after a volume's backup or restore", "app", key.String(), "container", t.ID(), "err", err)
			}
		}
	}
	for _, ctr := range ctrs {
		l, err := ctr.Labels(ctx)
		if err != nil || !labelHasVolume(l, name) {
			continue
		}
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			continue // no task: nothing writes
		}
		st, err := task.Status(ctx)
		if err != nil || st.Status != containerd.Running {
			continue
		}
		if err := task.Pause(ctx); err != nil {
			resume()
			return nil, fmt.Errorf("pause %s: %w", ctr.ID(), err)
		}
		paused = append(paused, task)
	}
	return resume, nil
}

// Backup writes the volume's contents to w as a tar archive (PAX), the app's
// containers that mount it paused meanwhile. Names are relative to the volume's
// root, ids are the container's (0 is the app's root).
func (v *Volumes) Backup(ctx context.Context, key types.NamespacedName, name string, w io.Writer) error {
	root, base, err := v.open(key, name)
	if err != nil {
		return err
	}
	defer root.Close()
	unlock, err := v.lockData(key, name)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(ctx, v.cfg.VolumeTransferTimeout)
	defer cancel()
	resume, err := v.pause(ctx, key, name)
	if err != nil {
		return err
	}
	defer resume()
	return streamOut(ctx, v.cfg.VolumeTransferTimeout, w, func(w io.Writer) error { return volumearchive.Write(ctx, root, base, w) })
}

// Restore replaces the volume's contents with the archive read from r, the app's
// containers that mount it paused meanwhile. An archive it refuses (an error
// wrapping ErrBadArchive) or a failure leaves the volume as it was.
func (v *Volumes) Restore(ctx context.Context, key types.NamespacedName, name string, r io.Reader) error {
	root, base, err := v.open(key, name)
	if err != nil {
		return err
	}
	defer root.Close()
	unlock, err := v.lockData(key, name)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(ctx, v.cfg.VolumeTransferTimeout)
	defer cancel()
	resume, err := v.pause(ctx, key, name)
	if err != nil {
		return err
	}
	defer resume()
	return streamIn(ctx, v.cfg.VolumeTransferTimeout, r, func(r io.Reader) error { return volumearchive.Restore(ctx, root, base, r) })
}
