package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/receive"
	"bex.co/bex/internal/buildslot"
)

// Pipeline is what turns code into a release: the apps' repositories and their
// locks, the build slots, the upstream fetch, the build, the release and the
// wait for its rollout, the background repacks and the disk margin. The SSH
// server's pushes run through it, and the backend's deploys (deploy,
// deploy:image, webhooks) call it: cmd/bex makes it first and hands it to both.
type Pipeline struct {
	cfg      Config
	apps     AppReader
	builder  Builder
	releaser Releaser
	// upstreamAuth gives an upstream fetch the app's deploy key and credentials;
	// nil: no ssh upstreams, https ones anonymously.
	upstreamAuth UpstreamAuth
	log          *slog.Logger
	metrics      *metrics

	locks  appLocks
	builds *buildslot.Pool // one slot per concurrent build

	// background are the async deploys still running; Shutdown waits for them.
	background sync.WaitGroup
	// repack runs git gc in the repositories pushes wrote to (repack.go).
	repack *repacker
}

// Option configures a Pipeline beyond its Config.
type Option func(*Pipeline)

// WithUpstreamAuth sets where the fetch of an app's upstream gets the app's
// deploy key and credentials.
func WithUpstreamAuth(a UpstreamAuth) Option { return func(p *Pipeline) { p.upstreamAuth = a } }

// New makes a pipeline. reg receives its metrics (nil: not registered).
func New(cfg Config, apps AppReader, b Builder, r Releaser, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withPaths()
	if apps == nil || b == nil || r == nil {
		return nil, errors.New("pipeline: an AppReader, a Builder and a Releaser are required")
	}
	if log == nil {
		log = slog.Default()
	}
	p := &Pipeline{
		cfg: cfg, apps: apps, builder: b, releaser: r,
		// The group is the gitserver's: the pipeline's lines are the pushes'.
		log:     log.WithGroup("gitserver"),
		metrics: newMetrics(reg),
		builds:  buildslot.NewPool(cfg.MaxConcurrentBuilds),
		repack:  newRepacker(),
	}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// Config is the pipeline's configuration, its paths derived.
func (p *Pipeline) Config() Config { return p.cfg }

// Limits are what a pack written into an app's repository may hold (a push's
// or an upstream fetch's), tips aside.
func (p *Pipeline) Limits() receive.Limits {
	return receive.Limits{MaxPackBytes: p.cfg.MaxPackBytes, MaxObjectBytes: p.cfg.MaxObjectBytes, MaxObjects: p.cfg.MaxPushObjects}
}

// Shutdown waits for the background deploys to end (or ctx to), then kills a
// running repack and drops the queued ones.
func (p *Pipeline) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() { p.background.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	p.repack.stop()
}

// Background runs f on its own goroutine as work Shutdown waits for (an async
// push's deploy).
func (p *Pipeline) Background(f func()) {
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		f()
	}()
}

// Lock takes app's lock for a push (owner says who pushes, for whoever waits
// behind it), waiting up to Config.LockWait and calling waiting once with the
// holder's description if it has to wait. Past LockWait the error is ErrBusy;
// when ctx ends first, ctx's error.
func (p *Pipeline) Lock(ctx context.Context, app, owner string, waiting func(holder string)) (unlock func(), err error) {
	lockCtx, cancel := context.WithTimeout(ctx, p.cfg.LockWait)
	defer cancel()
	unlock, err = p.locks.acquire(lockCtx, app, owner, waiting)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s is still busy after %s", ErrBusy, app, p.cfg.LockWait)
	}
	return unlock, nil
}

// Describe updates what holds app's lock, for the message that waiting pushes
// print.
func (p *Pipeline) Describe(app, owner string) { p.locks.describe(app, owner) }

// RemoveRepository deletes app's bare repository, for `apps:destroy`. It takes the
// app's push lock first, so that it never pulls the directory from under a push; a
// push that holds the lock longer than wait makes it fail, saying so.
func (p *Pipeline) RemoveRepository(ctx context.Context, app string, wait time.Duration) error {
	if !appv1.ValidAppName(app) {
		return fmt.Errorf("%q is not an app name", app)
	}
	lockCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	unlock, err := p.locks.acquire(lockCtx, app, "apps:destroy", nil)
	if err != nil {
		return &backend.Error{Kind: backend.Conflict, Msg: fmt.Sprintf("a push to %s is running: try again once it ends", app), Err: ErrBusy}
	}
	defer unlock()
	if err := os.RemoveAll(filepath.Join(p.cfg.ReposDir, app+".git")); err != nil {
		return fmt.Errorf("removing the repository of %s: %w", app, err)
	}
	return nil
}
