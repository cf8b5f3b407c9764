package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// The one way an App is made and a write is waited for in the cache, for the
// backend's apps:create and for the push that creates its app (CreatePushedApp):
// both write through the API server and read through the informers' cache, so a
// write returns once the cache has it, and the caller's next read finds it.

// NewApp creates the App name in namespace with members (none: admins only) and
// returns once r, the cache, holds it, for at most wait. An App that exists is the
// API server's AlreadyExists error (apierrors.IsAlreadyExists); an App created
// that the cache has not seen in time is an error wrapping ErrNotCached.
func NewApp(ctx context.Context, w client.Writer, r client.Reader, namespace, name string, members []string, wait time.Duration) (*appv1.App, error) {
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: appv1.AppSpec{Members: members}}
	if err := w.Create(ctx, app); err != nil {
		return nil, err
	}
	// The UID tells the new App from an older one of the same name whose
	// deletion the cache may not have seen yet.
	key := client.ObjectKey{Namespace: namespace, Name: name}
	if err := WaitCached(ctx, r, key, wait, func(c *appv1.App) bool { return c != nil && c.UID == app.UID }); err != nil {
		return app, err
	}
	return app, nil
}

// ErrNotCached is a write that was made but that the cache did not show within
// its bound: the watch is late or broken, and the next read may not see it.
var ErrNotCached = errors.New("the cache has not seen the change")

// WaitCached polls r (a cache: a local map, cheap to read, and no event handler to
// register per write) until the App at key satisfies done (nil: no such App),
// for at most wait. An error of the cache other than NotFound ends it; so does
// wait, with an error wrapping ErrNotCached.
func WaitCached(ctx context.Context, r client.Reader, key client.ObjectKey, wait time.Duration, done func(*appv1.App) bool) error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		a := &appv1.App{}
		err := r.Get(ctx, key, a)
		switch {
		case apierrors.IsNotFound(err):
			if done(nil) {
				return nil
			}
		case err == nil:
			if done(a) {
				return nil
			}
		case ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			// The time it waited, not the bound: the caller's context may
			// have ended first.
			return fmt.Errorf("%w after %s: %w", ErrNotCached, time.Since(began).Round(time.Millisecond), ctx.Err())
		case <-tick.C:
		}
	}
}
