package pipeline

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// repackLockWait is how long a repack waits for the app's lock before it gives up:
// a push or deploy that holds it comes first, and the next push asks again.
const repackLockWait = 2 * time.Second

// repacker keeps app repositories compact: after a push, the git binary's
// `git gc --auto` in the background. Every push stores one pack (receive.StorePack),
// so without it a repository grows a pack per push, and every read (upload-pack, the
// builder's fetch) opens them all.
//
// It holds the app's push lock while git runs, so a push never writes into a
// repository gc is rewriting: a push that comes meanwhile waits for it, as behind
// another push; a repack that finds the lock taken skips this round. One repack
// runs at a time in the server (the disk and CPU are the builds'), and an app
// queued or repacking is not queued again.
type repacker struct {
	mu     sync.Mutex
	queued map[string]bool
	slot   chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context // cancelled by Shutdown: a running git is killed
	cancel context.CancelFunc
	// ran, when set, is called after each attempt: skipped when git did not run
	// (tests).
	ran func(app string, err error, skipped bool)
}

func newRepacker() *repacker {
	ctx, cancel := context.WithCancel(context.Background())
	return &repacker{queued: map[string]bool{}, slot: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

// RepackLater queues a repack of app's repository, unless Config.RepackTimeout is 0
// or one is already queued or running for app.
func (p *Pipeline) RepackLater(app string) {
	r := p.repack
	if p.cfg.RepackTimeout == 0 || r == nil {
		return
	}
	r.mu.Lock()
	if r.queued[app] || r.ctx.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.queued[app] = true
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		skipped, err := p.repackNow(app)
		r.mu.Lock()
		delete(r.queued, app)
		ran := r.ran
		r.mu.Unlock()
		if err != nil {
			p.log.Warn("repack failed", "app", app, "err", err)
		}
		if ran != nil {
			ran(app, err, skipped)
		}
	}()
}

// repackNow waits for the server's repack slot, then for app's lock (briefly), and
// runs git gc --auto in its repository. skipped: the lock was busy, or the server
// is stopping.
func (p *Pipeline) repackNow(app string) (skipped bool, err error) {
	r := p.repack
	select {
	case r.slot <- struct{}{}:
	case <-r.ctx.Done():
		return true, nil
	}
	defer func() { <-r.slot }()
	lockCtx, cancel := context.WithTimeout(r.ctx, repackLockWait)
	unlock, err := p.locks.acquire(lockCtx, app, "a repack of the app's repository", nil)
	cancel()
	if err != nil {
		return true, nil
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(r.ctx, p.cfg.RepackTimeout)
	defer cancel()
	// The repository's own config (gc.auto, gc.autoPackLimit) decides whether
	// there is anything to do.
	return p.gitGC(ctx, app, "--auto")
}

// gitGC runs git gc with args in app's repository; the caller holds app's lock.
// skipped: there is no repository (destroyed meanwhile).
func (p *Pipeline) gitGC(ctx context.Context, app string, args ...string) (skipped bool, err error) {
	repoDir := p.RepositoryDir(app)
	if _, err := os.Stat(filepath.Join(repoDir, "HEAD")); err != nil {
		return true, nil // destroyed meanwhile
	}
	// gc.autoDetach=false: by default gc --auto forks into the background and
	// returns, and would then run outside the lock.
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "gc.autoDetach=false", "-C", repoDir, "gc", "--quiet"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + repoDir, "GIT_CONFIG_NOSYSTEM=1"}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, &repackError{err: err, out: string(out)}
	}
	p.log.Debug("repacked", "app", app, "args", args, "seconds", time.Since(start).Seconds())
	return false, nil
}

type repackError struct {
	err error
	out string
}

func (e *repackError) Error() string { return "git gc: " + e.err.Error() + ": " + e.out }

// stop kills a running repack, drops the queued ones and waits for them to end.
func (r *repacker) stop() {
	r.mu.Lock()
	r.cancel()
	r.mu.Unlock()
	r.wg.Wait()
}

// OnRepack calls f after each background repack attempt, with skipped when git
// did not run (the app's lock was busy, or the pipeline stopping): for tests,
// which wait for a repack rather than sleep.
func (p *Pipeline) OnRepack(f func(app string, skipped bool, err error)) {
	p.repack.mu.Lock()
	defer p.repack.mu.Unlock()
	p.repack.ran = func(app string, err error, skipped bool) { f(app, skipped, err) }
}
