package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/du"
)

// ErrRepositoryBusy: CompactRepository found the app's lock held (a push, a
// deploy, a background repack) and did not wait.
var ErrRepositoryBusy = fmt.Errorf("the repository is in use")

// RepositoryDir is the directory of app's bare repository.
func (p *Pipeline) RepositoryDir(app string) string {
	return filepath.Join(p.cfg.ReposDir, app+".git")
}

// RepositoryBytes is the size of app's repository on disk (`du -sb`, hard
// links once); 0 when it has none.
func (p *Pipeline) RepositoryBytes(app string) (int64, error) {
	if !appv1.ValidAppName(app) {
		return 0, fmt.Errorf("%q is not an app name", app)
	}
	return du.Bytes(p.RepositoryDir(app))
}

// IfIdle runs f under app's push lock, taken without waiting for a push (see
// tryLock): while a push or a deploy holds it, f does not run and the error is
// ErrRepositoryBusy. For work that must not run beside a push (system:prune's
// removal of images no release keeps yet: a push's new image gets its release
// under the lock).
func (p *Pipeline) IfIdle(app, owner string, f func() error) error {
	unlock, err := p.tryLock(app, owner)
	if err != nil {
		return err
	}
	defer unlock()
	return f()
}

// tryLock takes app's lock if it is free within repackLockWait: long enough for
// a background repack that holds it to end, and never for a push (its build
// and rollout take longer): the push goes first, the prune is skipped.
func (p *Pipeline) tryLock(app, owner string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), repackLockWait)
	defer cancel()
	unlock, err := p.locks.acquire(ctx, app, owner, nil)
	if err != nil {
		return nil, ErrRepositoryBusy
	}
	return unlock, nil
}

// CompactRepository runs `git gc --prune=now` in app's repository (system:prune):
// unreachable objects go at once, not after gc's two weeks. It takes the app's
// push lock without waiting for a push (tryLock), so it never runs while a push
// or a deploy holds it (ErrRepositoryBusy), and waits its turn behind a
// running background repack (one gc at a time). It returns the
// bytes freed.
func (p *Pipeline) CompactRepository(ctx context.Context, app string) (freed int64, err error) {
	if !appv1.ValidAppName(app) {
		return 0, fmt.Errorf("%q is not an app name", app)
	}
	if r := p.repack; r != nil {
		select {
		case r.slot <- struct{}{}:
			defer func() { <-r.slot }()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	unlock, err := p.tryLock(app, "system:prune's git gc")
	if err != nil {
		return 0, err
	}
	defer unlock()
	before, err := p.RepositoryBytes(app)
	if err != nil {
		return 0, err
	}
	timeout := p.cfg.RepackTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	gctx, cancelGC := context.WithTimeout(ctx, timeout)
	defer cancelGC()
	if _, err := p.gitGC(gctx, app, "--prune=now"); err != nil {
		return 0, err
	}
	after, err := p.RepositoryBytes(app)
	if err != nil {
		return 0, err
	}
	return max(before-after, 0), nil
}
