package backend

import (
	"context"
	"errors"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
)

// checkAppName refuses what cannot be an app's name.
func checkAppName(name string) error {
	if err := appv1.CheckAppName(name); err != nil {
		return &Error{Kind: Invalid, Msg: err.Error()}
	}
	return nil
}

func noSuchApp(name string) error {
	return Errorf(NotFound, "no app %q: apps:list shows the apps you can use", name)
}

// app reads an app u may use, from the cache, and records it in ctx's Uses
// (the request's access to it is then checked again while it runs).
func (b *Backend) app(ctx context.Context, u *User, name string) (*appv1.App, error) {
	if err := checkAppName(name); err != nil {
		return nil, err
	}
	if err := u.inScope(name); err != nil {
		return nil, err
	}
	a := &appv1.App{}
	if err := b.cfg.Reader.Get(ctx, b.key(name), a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, noSuchApp(name)
		}
		return nil, fmt.Errorf("reading app %s: %w", name, err)
	}
	if !u.MayUseApp(name, a.Spec.Members) {
		return nil, Errorf(Forbidden, "user %s has no access to app %s: an admin or a member of %s can run access:add %s %s", u.Name, name, name, name, u.Name)
	}
	Used(ctx, a.Name)
	return a, nil
}

// apps lists the apps u may use, by name (of a token limited to some apps,
// those).
func (b *Backend) apps(ctx context.Context, u *User) ([]appv1.App, error) {
	var apps appv1.AppList
	if err := b.cfg.Reader.List(ctx, &apps, client.InNamespace(b.cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("listing apps: %w", err)
	}
	out := []appv1.App{}
	for _, a := range apps.Items {
		if u.MayUseApp(a.Name, a.Spec.Members) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// update changes app through the API server (after checking access on a fresh
// read), retrying on conflicts, and waits until the cache has the change so
// that the next read sees it. change returns an *Error to refuse, or
// errNoChange to end without writing (update then returns errNoChange).
func (b *Backend) update(ctx context.Context, u *User, name string, change func(*appv1.App) error) (*appv1.App, error) {
	if _, err := b.app(ctx, u, name); err != nil {
		return nil, err
	}
	var updated *appv1.App
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a := &appv1.App{}
		if err := b.cfg.Client.Get(ctx, b.key(name), a); err != nil {
			if apierrors.IsNotFound(err) {
				return noSuchApp(name)
			}
			return err
		}
		if !u.MayUseApp(name, a.Spec.Members) {
			return Errorf(Forbidden, "user %s has no access to app %s", u.Name, name)
		}
		before := a.DeepCopy()
		if err := change(a); err != nil {
			return err
		}
		if p := planOf(ctx); p != nil {
			// The API server checks the change as it would the write (its
			// validation, the CRD's rules), keeping nothing.
			if err := b.cfg.Client.Update(ctx, a, client.DryRunAll); err != nil {
				return err
			}
			planApp(p, before, a)
			return errDryRun
		}
		if err := b.cfg.Client.Update(ctx, a); err != nil {
			return err
		}
		updated = a
		return nil
	})
	switch {
	case errors.Is(err, errNoChange):
		return nil, errNoChange
	case apierrors.IsInvalid(err):
		return nil, Errorf(Invalid, "the API refused the change of %s: %s", name, apierrors.ReasonForError(err))
	case apierrors.IsConflict(err):
		return nil, Errorf(Conflict, "%s changed too often meanwhile: try again", name)
	case err != nil:
		return nil, err
	}
	return updated, b.waitCached(ctx, name, func(a *appv1.App) bool {
		return a != nil && a.UID == updated.UID && seenSince(a, updated)
	})
}

// seenSince reports whether cached is written at or after updated: its
// resourceVersion is not older (the API server's are ordered integers, which
// apimachinery compares). Another writer's change right after this one (the
// deployer's status, which does not move the generation) moves the cache past
// updated's version before a poll sees it, which the version's equality alone
// missed (the wait then ran out). The generation is the fallback for versions
// that are not integers.
func seenSince(cached, updated *appv1.App) bool {
	if c, err := resourceversion.CompareResourceVersion(cached.ResourceVersion, updated.ResourceVersion); err == nil {
		return c >= 0
	}
	return cached.ResourceVersion == updated.ResourceVersion || cached.Generation > updated.Generation
}

// waitCached waits until the cached app satisfies done (nil app: gone), for at
// most CacheWait. A watch delivers in milliseconds; past the bound the write
// stands and the error says so.
func (b *Backend) waitCached(ctx context.Context, name string, done func(*appv1.App) bool) error {
	if err := WaitCached(ctx, b.cfg.Reader, b.key(name), b.cfg.CacheWait, done); err != nil {
		if errors.Is(err, ErrNotCached) {
			return fmt.Errorf("the change of %s was made, but this server's cache has not seen it yet: the next command may not show it", name)
		}
		return err
	}
	return nil
}

// Apps lists the apps u may use, by name.
func (b *Backend) Apps(ctx context.Context, u *User) ([]AppSummary, error) {
	apps, err := b.apps(ctx, u)
	if err != nil {
		return nil, err
	}
	out := make([]AppSummary, 0, len(apps))
	for i := range apps {
		out = append(out, summaryOf(&apps[i]))
	}
	return out, nil
}

// App is one app u may use, as apps:info and app_status show it.
func (b *Backend) App(ctx context.Context, u *User, name string) (*AppInfo, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	in := infoOf(a, b.cfg.Host)
	if rels, err := b.cfg.Releases.List(ctx, a.Name); err == nil && len(rels) > 0 {
		ri := releaseInfoOf(&rels[0], a)
		in.LastRelease = &ri
	}
	if b.cfg.Builds != nil {
		if builds, err := b.cfg.Builds.List(a.Name); err == nil && len(builds) > 0 {
			bi := builds[0]
			in.LastBuild = &bi
		}
	}
	in.Disk = b.appUsage(ctx, a.Name, a.Spec.Image)
	return in, nil
}

// CreateApp creates an app whose first member is u.
func (b *Backend) CreateApp(ctx context.Context, u *User, name string) error {
	if err := u.mayChange("apps:create"); err != nil {
		return err
	}
	if err := checkAppName(name); err != nil {
		return err
	}
	if !u.CanCreateApps {
		return Errorf(Forbidden, "user %s may not create apps: ask an admin to create %s and run access:add %s %s", u.Name, name, name, u.Name)
	}
	if err := u.unlimited("apps:create"); err != nil {
		return err
	}
	_, err := NewApp(ctx, b.cfg.Client, b.cfg.Reader, b.cfg.Namespace, name, []string{u.Name}, b.cfg.CacheWait)
	switch {
	case apierrors.IsAlreadyExists(err):
		return Errorf(Conflict, "app %s exists already: pick another name", name)
	case errors.Is(err, ErrNotCached):
		b.audit(u, "apps:create", name)
		return fmt.Errorf("the change of %s was made, but this server's cache has not seen it yet: the next command may not show it", name)
	case err != nil:
		return fmt.Errorf("creating app %s: %w", name, err)
	}
	b.audit(u, "apps:create", name)
	return nil
}

// DestroyApp deletes an app, its webhook secret, its repository and its build logs; confirm
// must be the app's name again. The deployer stops its processes (its
// finalizer) before the App goes, and its Releases go with it.
func (b *Backend) DestroyApp(ctx context.Context, u *User, name, confirm string) error {
	if err := u.mayChange("apps:destroy"); err != nil {
		return err
	}
	// Destroying an app is for its members themselves: a token limited to some
	// apps works on them, and cannot take one away for good.
	if err := u.unlimited("apps:destroy"); err != nil {
		return err
	}
	app, err := b.app(ctx, u, name)
	if err != nil {
		return err
	}
	if confirm != name {
		return Errorf(Invalid, "this deletes %s for good: to go on, run apps:destroy %s --confirm %s", name, name, name)
	}
	// The webhook Secret first, while a failure can still be retried: in the
	// secrets namespace it has no owner reference (none crosses namespaces), and
	// the deployer, which finalizes the App, may read no Secrets; under bex up no
	// garbage collector acts on owner references either.
	if err := hooksecrets.Delete(ctx, b.cfg.Client, b.cfg.SecretsNamespace, app); err != nil {
		return fmt.Errorf("deleting the webhook secret of %s: %w", name, err)
	}
	if b.cfg.RemoveRepository != nil {
		// Its errors have kinds: Conflict while a push holds the app.
		if err := b.cfg.RemoveRepository(ctx, name); err != nil {
			return err
		}
	}
	if b.cfg.RemoveBuildLogs != nil {
		if err := b.cfg.RemoveBuildLogs(name); err != nil {
			return fmt.Errorf("deleting the build logs of %s: %w", name, err)
		}
	}
	err = b.cfg.Client.Delete(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.cfg.Namespace}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting app %s: %w", name, err)
	}
	b.audit(u, "apps:destroy", name)
	return nil
}

// WhoAmI is who u is to this server.
func (b *Backend) WhoAmI(u *User) WhoAmI {
	return WhoAmI{Name: u.Name, Role: string(u.Role()), CanCreateApps: u.CanCreateApps, Key: u.KeyName, Fingerprint: u.KeyFingerprint}
}
