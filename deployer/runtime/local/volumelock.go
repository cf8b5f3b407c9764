package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// A volume's backup or restore and the starts of the containers that mount it
// exclude each other, across processes (the gitserver backs up, the deployer and
// the gitserver start containers), through the flock of the volume's data lock
// file, <name>.data.lock beside its image: a backup or restore holds it
// exclusively for as long as the containers are paused; a start holds it shared
// from the task's creation until it runs, so a start waits for the backup to end
// (at most Config.VolumeTransferTimeout and a minute), and a backup that comes
// during a start finds the task running and pauses it too. A paused container
// whose data lock nobody holds is a leftover of a backup whose process died: the
// deployer resumes it (watchPaused).

// dataLockPoll is how often a start waiting for a backup tries the lock again.
const dataLockPoll = 200 * time.Millisecond

// dataLockName is the lock file (without ".lock") of volume name's contents.
func dataLockName(name string) string { return name + ".data" }

// volumesOfLabels are the volumes a container's labels say it mounts.
func volumesOfLabels(l map[string]string) []string {
	var out []string
	for name := range strings.SplitSeq(l[labelVolumes], ",") {
		if volumeNameOK(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tryVolumesShared takes the data locks of names shared without waiting: ok is
// false when a backup or restore holds one of them.
func (cfg Config) tryVolumesShared(key types.NamespacedName, names []string) (unlock func(), ok bool, err error) {
	var held []*os.File
	unlock = func() {
		for _, f := range held {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
		}
	}
	for _, name := range names {
		f, err := cfg.openVolumeLock(key, dataLockName(name))
		if err != nil {
			unlock()
			return nil, false, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
			f.Close()
			unlock()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("lock volume %s: %w", name, err)
		}
		held = append(held, f)
	}
	return unlock, true, nil
}

// holdVolumesForStart takes the data locks of names shared, for the start of a
// container that mounts them, waiting while a backup or restore holds one, at
// most cfg.VolumeTransferTimeout and a minute (a backup's own bound, and its
// resume). what names the container in the log.
func (cfg Config) holdVolumesForStart(ctx context.Context, key types.NamespacedName, names []string, what string, log *slog.Logger) (unlock func(), err error) {
	if len(names) == 0 {
		return func() {}, nil
	}
	wait := cfg.VolumeTransferTimeout + time.Minute
	deadline := time.Now().Add(wait)
	logged := false
	for {
		unlock, ok, err := cfg.tryVolumesShared(key, names)
		if err != nil || ok {
			if logged {
				log.Info("the backup or restore of a volume ended: starting", "app", key.String(), "container", what)
			}
			return unlock, err
		}
		if !logged {
			logged = true
			log.Info("waiting for the backup or restore of a volume to end before starting", "app", key.String(), "container", what, "volumes", strings.Join(names, ","))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("volume %s of %s is being backed up or restored for more than %v: not started", strings.Join(names, " or "), key.Name, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(dataLockPoll):
		}
	}
}

// pausedTask reports whether ctr's task is paused (or being paused): frozen by
// a volume's backup or restore, it answers nothing.
func pausedTask(ctx context.Context, ctr containerd.Container) bool {
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return false
	}
	st, err := task.Status(ctx)
	return err == nil && (st.Status == containerd.Paused || st.Status == containerd.Pausing)
}

// thawIfOrphaned resumes ctr's task when it is paused and no backup or restore
// holds the data lock of the volumes it mounts: the process that paused it died
// before it resumed it. It reports whether a backup or restore holds the lock
// (whose process resumes it).
func (cfg Config) thawIfOrphaned(ctx context.Context, ctr containerd.Container, log *slog.Logger) (stillPaused bool, err error) {
	l, err := ctr.Labels(ctx)
	if err != nil {
		return false, err
	}
	names := volumesOfLabels(l)
	if len(names) == 0 {
		return false, nil // not paused by bex
	}
	key := types.NamespacedName{Namespace: l[labelNamespace], Name: l[labelApp]}
	unlock, ok, err := cfg.tryVolumesShared(key, names)
	if err != nil {
		return false, err
	}
	if !ok {
		return true, nil // a backup or restore runs: its process resumes it
	}
	defer unlock()
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return false, nil
	}
	st, err := task.Status(ctx)
	if err != nil || st.Status != containerd.Paused {
		return false, err
	}
	log.Warn("resuming a container left paused by a backup or restore that did not end (its process went)", "app", key.String(), "container", ctr.ID())
	return false, task.Resume(ctx)
}

// watchPaused resumes container id once its task is paused with no backup or
// restore holding its volumes (one watcher a container at a time, until the
// runtime closes): started on each TaskPaused event and for each paused task
// adopted.
func (r *Runtime) watchPaused(id string) {
	r.mu.Lock()
	if r.thawing == nil {
		r.thawing = map[string]bool{}
	}
	if r.thawing[id] || r.ctx.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.thawing[id] = true
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			delete(r.thawing, id)
			r.mu.Unlock()
		}()
		for {
			ctr, err := r.cd.LoadContainer(r.ctx, id)
			if err != nil {
				return // gone
			}
			paused, err := r.cfg.thawIfOrphaned(r.ctx, ctr, r.log)
			if err != nil && r.ctx.Err() == nil {
				r.log.Warn("resume a paused container", "container", id, "err", err)
			}
			if !paused {
				return
			}
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
}

// errTransferTimeout ends a backup or restore that took longer than
// Config.VolumeTransferTimeout.
var errTransferTimeout = errors.New("took longer than the volume transfer timeout")

// transferErr is why a backup or restore's stream ended with ctx.
func transferErr(ctx context.Context, limit time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w (%v): cancelled, the app's containers resumed", errTransferTimeout, limit)
	}
	return ctx.Err()
}

// streamOut runs write with a writer to w that fails as soon as ctx ends, even
// while w blocks (a client that stopped reading): a backup's pause ends with
// ctx. It returns once everything write wrote is in w, or ctx ended.
func streamOut(ctx context.Context, limit time.Duration, w io.Writer, write func(io.Writer) error) error {
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		// Through w's Write (not a ReadFrom of its own), as write would.
		_, err := io.Copy(struct{ io.Writer }{w}, pr)
		_ = pr.CloseWithError(err) // a failing w fails write
		copied <- err
	}()
	stop := context.AfterFunc(ctx, func() { _ = pw.CloseWithError(transferErr(ctx, limit)) })
	defer stop()
	err := write(pw)
	_ = pw.CloseWithError(err) // nil: the copy ends at EOF
	select {
	case cerr := <-copied:
		if err == nil {
			err = cerr
		}
	case <-ctx.Done():
		err = transferErr(ctx, limit)
	}
	return err
}

// streamIn runs read with a reader of r that fails as soon as ctx ends, even
// while r blocks (a client that stopped sending).
func streamIn(ctx context.Context, limit time.Duration, r io.Reader, read func(io.Reader) error) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, r)
		_ = pw.CloseWithError(err)
	}()
	stop := context.AfterFunc(ctx, func() { _ = pr.CloseWithError(transferErr(ctx, limit)) })
	defer stop()
	err := read(pr)
	_ = pr.Close() // the copy stops at its next write
	if err != nil && ctx.Err() != nil {
		// Not the archive's fault (its reads failed): the sender cannot fix it.
		return transferErr(ctx, limit)
	}
	return err
}
