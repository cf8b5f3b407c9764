package imageimport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"time"

	"bex.co/bex/internal/bytesize"
)

// Two ways an import ends before its Timeout, each the cause of the import's
// context, so that Import tells them apart from an error of the registry
// whatever containerd or go-containerregistry wrapped around it.
var (
	// errStalled: a response body (a blob, a manifest) gave no byte for
	// Config.StallTimeout while it was read.
	errStalled = errors.New("the registry stalled")
	// errDiskFull: the disk the image goes to fell under the margin while it
	// was pulled or unpacked.
	errDiskFull = errors.New("the disk fell under its margin")
)

// abortKey carries an import's context.CancelCauseFunc to the transport, so
// that a stalled body ends the whole import, not only its own request.
type abortKey struct{}

func withAbort(ctx context.Context, abort context.CancelCauseFunc) context.Context {
	return context.WithValue(ctx, abortKey{}, abort)
}

// stallTransport ends a request whose body gives nothing for timeout while
// it is read: a registry that stops sending mid-blob would otherwise hold the
// import until its Timeout (30 minutes), its partial content on the disk. The
// clock runs only while a Read waits, so a slow reader (the content store) is
// not taken for a stalled registry.
type stallTransport struct {
	base    http.RoundTripper
	timeout time.Duration
}

func (s stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	resp, err := s.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel(nil)
		return nil, err
	}
	abort, _ := req.Context().Value(abortKey{}).(context.CancelCauseFunc)
	resp.Body = &stallBody{body: resp.Body, timeout: s.timeout, cancel: cancel, abort: abort}
	return resp, nil
}

type stallBody struct {
	body    io.ReadCloser
	timeout time.Duration
	cancel  context.CancelCauseFunc
	abort   context.CancelCauseFunc // the import's, or nil

	mu      sync.Mutex
	timer   *time.Timer
	stalled bool
}

func (b *stallBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.timer == nil {
		b.timer = time.AfterFunc(b.timeout, b.stall)
	} else {
		b.timer.Reset(b.timeout)
	}
	b.mu.Unlock()
	n, err := b.body.Read(p)
	b.mu.Lock()
	b.timer.Stop()
	stalled := b.stalled
	b.mu.Unlock()
	if stalled && err != nil {
		return n, errStalled
	}
	return n, err
}

func (b *stallBody) stall() {
	b.mu.Lock()
	b.stalled = true
	b.mu.Unlock()
	if b.abort != nil {
		b.abort(errStalled)
	}
	b.cancel(errStalled)
}

func (b *stallBody) Close() error {
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	err := b.body.Close()
	b.cancel(nil)
	return err
}

// diskPoll is how often the disk is asked for its free space during a pull:
// statfs is a cheap system call (the builder asks every 20 ms).
const diskPoll = 50 * time.Millisecond

// margin is the free space kept on the disk of Config.DiskDir, of total
// bytes: the smaller of MinFreeBytes and MinFreePercent of total (the
// gitserver's --min-free-disk); 0 turns the checks off.
func (c Config) margin(total uint64) uint64 {
	if c.DiskDir == "" || c.MinFreeBytes <= 0 || c.MinFreePercent <= 0 {
		return 0
	}
	m := uint64(c.MinFreeBytes)
	if p := uint64(float64(total) * c.MinFreePercent / 100); p < m {
		m = p
	}
	return m
}

// room is what the disk of Config.DiskDir can take above its margin now, and
// the margin; ok is false when there is nothing to check (no DiskDir, no
// margin, a file system that cannot be asked).
func (i *Importer) room() (room, free, margin uint64, ok bool) {
	if i.cfg.DiskDir == "" {
		return 0, 0, 0, false
	}
	free, total, err := statfs(i.cfg.DiskDir)
	if err != nil {
		return 0, 0, 0, false
	}
	margin = i.cfg.margin(total)
	if margin == 0 {
		return 0, 0, 0, false
	}
	if free > margin {
		room = free - margin
	}
	return room, free, margin, true
}

// fits refuses, in one line, what the disk cannot take: need bytes of what
// (the compressed layers before the pull, what they unpack to before the
// unpack) above the margin.
func (i *Importer) fits(ref, what string, need int64) error {
	room, free, margin, ok := i.room()
	if !ok || uint64(need) <= room {
		return nil
	}
	return errorf(ErrInvalid, "%s %s %s and the disk of %s has %s free, %s of it kept by bex: nothing was kept; free space on that disk and deploy the image again",
		ref, what, bytesize.Format(need), i.cfg.DiskDir, bytesize.Format(int64(free)), bytesize.Format(int64(margin)))
}

// watchDisk cancels ctx with errDiskFull when the disk of Config.DiskDir
// falls under its margin, until stop is called; lowest is the least free
// space it saw.
func (i *Importer) watchDisk(ctx context.Context, abort context.CancelCauseFunc) (stop func() (lowest, margin uint64)) {
	_, free, margin, ok := i.room()
	if !ok {
		return func() (uint64, uint64) { return 0, 0 }
	}
	lowest := free
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(diskPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			free, _, err := statfs(i.cfg.DiskDir)
			if err != nil {
				continue
			}
			lowest = min(lowest, free)
			if free < margin {
				abort(errDiskFull)
				return
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		<-exited
		return lowest, margin
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

// stalledError is the one line of an import whose registry stalled.
func (i *Importer) stalledError(ref, host string) error {
	return fmt.Errorf("pulling %s from %s stopped: the registry sent nothing for %s in the middle of the image; nothing was kept: deploy the image again later, or from another registry", ref, host, i.cfg.StallTimeout)
}
