package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// A push's admission: who may push to an app, and the app made on its first
// push. The SSH server carries the push; the decisions are here, beside the
// other operations' (app, CreateApp), so that every way in keeps one rule.

// PushTarget is the app a push goes to, as its admission found it.
type PushTarget struct {
	Name string
	// DeployBranch is the branch whose pushes deploy; empty until the first
	// push records one.
	DeployBranch string
	// Exists is false when the app is still to be made (CreatePushedApp): the
	// push is its first.
	Exists bool
	// Serving is the release that serves (0: none), for the audit trail.
	Serving int64
}

func targetOf(a *appv1.App) *PushTarget {
	return &PushTarget{Name: a.Name, DeployBranch: a.Spec.Git.DeployBranch, Exists: true, Serving: a.Status.Revision}
}

// AdmitPush decides whether u may push to the app name, from the cache: an app
// u may use is its target; a missing app is a target that does not exist yet
// when u may create apps (admins and creators), a Forbidden error otherwise; an
// app of others is a Forbidden error. The messages are git's one line (fatal:
// remote error: ...), so they say what to do. The caller marks name as used
// (Used) once the push goes on.
func (b *Backend) AdmitPush(ctx context.Context, u *User, name string) (*PushTarget, error) {
	if err := u.mayChange("git push"); err != nil {
		return nil, err
	}
	if err := checkAppName(name); err != nil {
		return nil, err
	}
	if err := u.inScope(name); err != nil {
		return nil, err
	}
	a := &appv1.App{}
	err := b.cfg.Reader.Get(ctx, b.key(name), a)
	switch {
	case apierrors.IsNotFound(err):
		if !u.Admin && !u.CanCreateApps {
			return nil, Errorf(Forbidden, "app %s does not exist, and user %s may not create apps: ask an admin to create it", name, u.Name)
		}
		if err := u.unlimited("creating an app"); err != nil {
			return nil, err
		}
		return &PushTarget{Name: name}, nil
	case err != nil:
		return nil, fmt.Errorf("reading app %s: %w", name, err)
	case !u.MayUseApp(name, a.Spec.Members):
		return nil, Errorf(Forbidden, "user %s has no access to app %s: ask an admin to add you to its members", u.Name, name)
	}
	return targetOf(a), nil
}

// CreatePushedApp makes the app of a first push (AdmitPush found none), with u
// as its first member, and returns once the cache has it. When a concurrent
// push or apps:create made it meanwhile, access is checked on that app as
// AdmitPush would: its target, or a Forbidden error.
func (b *Backend) CreatePushedApp(ctx context.Context, u *User, name string) (*PushTarget, error) {
	if err := u.mayChange("git push"); err != nil {
		return nil, err
	}
	if err := checkAppName(name); err != nil {
		return nil, err
	}
	if err := u.unlimited("creating an app"); err != nil {
		return nil, err
	}
	a, err := NewApp(ctx, b.cfg.Client, b.cfg.Reader, b.cfg.Namespace, name, []string{u.Name}, b.cfg.CacheWait)
	switch {
	case apierrors.IsAlreadyExists(err):
		existing := &appv1.App{}
		if err := b.cfg.Reader.Get(ctx, b.key(name), existing); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("app %q: app not found", name)
			}
			return nil, fmt.Errorf("get app %q: %w", name, err)
		}
		if !u.MayUseApp(name, existing.Spec.Members) {
			return nil, Errorf(Forbidden, "user %s has no access to app %s", u.Name, name)
		}
		return targetOf(existing), nil
	case errors.Is(err, ErrNotCached):
		b.audit(u, "git push", name, "created", true, "via", ViaGit)
		return nil, fmt.Errorf("app %q was created, but the cache has not seen it: %w", name, err)
	case err != nil:
		return nil, fmt.Errorf("create app %q: %w", name, err)
	}
	b.audit(u, "git push", name, "created", true, "via", ViaGit)
	return targetOf(a), nil
}

// SetDeployBranch records branch as the deploy branch of the app name, which u
// may use (an empty branch clears it), and returns once the cache has the
// change, so that the next read of the app sees it.
func (b *Backend) SetDeployBranch(ctx context.Context, u *User, name, branch string) error {
	if err := u.mayChange("git push"); err != nil {
		return err
	}
	if _, err := b.app(ctx, u, name); err != nil {
		return err
	}
	// A JSON merge patch of this one field: it carries no resourceVersion and no other
	// field, so it neither conflicts with nor undoes what other writers (the deployer,
	// kubectl) changed since we last read the App.
	var value any // null removes the field
	if branch != "" {
		value = branch
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"git": map[string]any{"deployBranch": value}}})
	if err != nil {
		return err
	}
	a := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.cfg.Namespace}}
	if err := b.cfg.Client.Patch(ctx, a, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			return noSuchApp(name)
		}
		return fmt.Errorf("set deploy branch of app %q to %q: %w", name, branch, err)
	}
	// The generation grows with every spec change, so a cached App at least as new as
	// the patched one includes this patch, even if others wrote after it.
	if err := WaitCached(ctx, b.cfg.Reader, b.key(name), b.cfg.CacheWait, func(c *appv1.App) bool {
		return c != nil && c.UID == a.UID && c.Generation >= a.Generation
	}); err != nil {
		return fmt.Errorf("deploy branch of app %q was set, but the cache has not seen it: %w", name, err)
	}
	return nil
}

// PushDone is how a push's deploy ended, for the audit trail.
type PushDone struct {
	Commit, Branch string
	// Before is the release that served when the push began; Release the one
	// it made (0: none).
	Before, Release int64
	// Failure is why it did not serve ("": it serves).
	Failure string
}

// Pushed keeps a push's deploy in the audit trail: a change made by git.
func (b *Backend) Pushed(u *User, app string, d PushDone) {
	attrs := []any{"via", ViaGit, "commit", d.Commit, "branch", d.Branch, "before", d.Before, "release", d.Release}
	if d.Failure != "" {
		attrs = append(attrs, "error", d.Failure)
	}
	b.audit(u, "git push", app, attrs...)
}
