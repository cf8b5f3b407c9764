package builder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"bex.co/bex/internal/bytesize"
)

// ErrDiskFull is the error of a build that filled the disk it writes to (its
// steps' files, its layers): stopped under the margin, or failed on ENOSPC, and
// what it wrote given back (awaited, at most 30 s) before Build returns.
var ErrDiskFull = errors.New("the build filled the disk")

// diskPoll is how often a running build's disk is asked for its free space:
// statfs is a cheap system call, and a step writing at a tmpfs's speed crosses
// the margin in tens of milliseconds.
const diskPoll = 20 * time.Millisecond

// diskGuard watches the free space of the file system of the state dir (where
// buildkitd keeps its snapshots on one machine) while a build runs, and stops the
// build when it falls under the margin, before the build takes what etcd, the
// running apps and the platform's logs need. A step that writes faster than the
// guard can stop it still meets the kernel's ENOSPC first; the guard has seen the
// disk full all the same, and the build's error says so in place of the step's
// own (an I/O error, a failed write).
type diskGuard struct {
	dir          string
	margin       uint64
	total        uint64
	lowest       atomic.Uint64
	stop, exited chan struct{}
	once         sync.Once
}

// watchDisk starts the guard for one build; the returned context ends when the
// guard stops the build. It returns a nil guard (and ctx) when there is nothing
// to watch: no state dir, no margin, or a file system that cannot be asked.
func (b *Builder) watchDisk(ctx context.Context) (context.Context, *diskGuard) {
	dir := b.cfg.StateDir
	if dir == "" || b.cfg.MinFreeBytes <= 0 || b.cfg.MinFreePercent <= 0 {
		return ctx, nil
	}
	free, total, err := statfs(dir)
	if err != nil {
		b.log.Warn("cannot read the free disk space; builds are not watched", "dir", dir, "err", err)
		return ctx, nil
	}
	margin := uint64(b.cfg.MinFreeBytes)
	if p := uint64(float64(total) * b.cfg.MinFreePercent / 100); p < margin {
		margin = p
	}
	g := &diskGuard{dir: dir, margin: margin, total: total, stop: make(chan struct{}), exited: make(chan struct{})}
	g.lowest.Store(free)
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		defer close(g.exited)
		t := time.NewTicker(diskPoll)
		defer t.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-t.C:
			}
			free, _, err := statfs(dir)
			if err != nil {
				continue
			}
			if free < g.lowest.Load() {
				g.lowest.Store(free)
			}
			if free < margin {
				cancel(ErrDiskFull)
			}
		}
	}()
	return ctx, g
}

// done stops the guard and returns the error the build ends with: err, or, when
// the build failed and the disk fell under the margin while it ran, an
// ErrDiskFull that says how full it got.
func (g *diskGuard) done(err error) error {
	if g == nil {
		return err
	}
	g.once.Do(func() { close(g.stop) })
	<-g.exited
	// A last look: a step that failed on ENOSPC a moment ago has not yet given
	// its files back.
	if free, _, serr := statfs(g.dir); serr == nil && free < g.lowest.Load() {
		g.lowest.Store(free)
	}
	lowest := g.lowest.Load()
	if err == nil || lowest >= g.margin {
		return err
	}
	g.awaitRoom()
	return fmt.Errorf("%w of %s (%s free of %s, under the %s bex keeps for the platform and the apps): make it write less, or free space on that disk",
		ErrDiskFull, g.dir, bytesize.Format(int64(lowest)), bytesize.Format(int64(g.total)), bytesize.Format(int64(g.margin)))
}

// releaseWait bounds how long a build that filled the disk waits for buildkitd
// to give back what it wrote.
const releaseWait = 30 * time.Second

// awaitRoom waits, at most releaseWait, until the disk has its margin free
// again: buildkitd removes a failed step's files in its garbage collection, a
// second or so after the build, and until then the disk is still full. The
// build's record, written next, and the push's refusal need room; so does the
// next push, which the gitserver would refuse on a disk still under the margin.
func (g *diskGuard) awaitRoom() {
	deadline := time.Now().Add(releaseWait)
	for time.Now().Before(deadline) {
		if free, _, err := statfs(g.dir); err != nil || free >= g.margin {
			return
		}
		time.Sleep(diskPoll)
	}
}

// statfs is the free (to an unprivileged writer) and total bytes of the file
// system holding path.
func statfs(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}
