package appops

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/api/resource"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
)

// Kind is the sort of a refusal, for transports that map it (an exit status, a
// tool error's code).
type Kind string

// The kinds of refusal.
const (
	NotFound  Kind = "not_found"
	Forbidden Kind = "forbidden"
	Invalid   Kind = "invalid"
	Conflict  Kind = "conflict"
)

// Error is a refusal: the user's request cannot be done as asked.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Fail makes an Error.
func Fail(kind Kind, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// KindOf returns err's Kind, or "" for an internal failure.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// ErrNoChange, returned by an Update's change func, ends it without writing.
var ErrNoChange = errors.New("no change")

// Ops works on the Apps of one namespace.
type Ops struct {
	// Client writes to the API server.
	Client client.Client
	// Reader reads Apps, usually from an informer cache.
	Reader    client.Reader
	Namespace string
	// Releases records and lists releases.
	Releases *releases.Recorder
	// CacheWait bounds how long a write waits for Reader to see it.
	CacheWait time.Duration
}

var appNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// CheckAppName refuses what cannot be an app's name.
func CheckAppName(name string) error {
	if len(name) > appv1.MaxAppNameLength || !appNameRE.MatchString(name) {
		return Fail(Invalid, "%q is not an app name: use 1 to %d lower-case letters, digits and '-', starting and ending with a letter or digit", name, appv1.MaxAppNameLength)
	}
	return nil
}

// CanAccess reports whether u may use app: admins always, members when listed, by
// exact name.
func CanAccess(u *gitserver.User, app *appv1.App) bool {
	return u.Admin || slices.Contains(app.Spec.Members, u.Name)
}

func (o *Ops) key(app string) client.ObjectKey {
	return client.ObjectKey{Namespace: o.Namespace, Name: app}
}

// App reads an app u may use, from the cache.
func (o *Ops) App(ctx context.Context, u *gitserver.User, name string) (*appv1.App, error) {
	if err := CheckAppName(name); err != nil {
		return nil, err
	}
	a := &appv1.App{}
	if err := o.Reader.Get(ctx, o.key(name), a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, Fail(NotFound, "no app %q: apps:list shows the apps you can use", name)
		}
		return nil, fmt.Errorf("reading app %s: %w", name, err)
	}
	if !CanAccess(u, a) {
		return nil, Fail(Forbidden, "user %s has no access to app %s: an admin or a member of %s can run access:add %s %s", u.Name, name, name, name, u.Name)
	}
	return a, nil
}

// Apps lists the apps u may use, by name.
func (o *Ops) Apps(ctx context.Context, u *gitserver.User) ([]appv1.App, error) {
	var apps appv1.AppList
	if err := o.Reader.List(ctx, &apps, client.InNamespace(o.Namespace)); err != nil {
		return nil, fmt.Errorf("listing apps: %w", err)
	}
	out := []appv1.App{}
	for _, a := range apps.Items {
		if CanAccess(u, &a) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Update changes app through the API server (after checking access on a fresh
// read), retrying on conflicts, and waits until the cache has the change so that
// the next read sees it. change returns an *Error to refuse, or ErrNoChange.
func (o *Ops) Update(ctx context.Context, u *gitserver.User, name string, change func(*appv1.App) error) (*appv1.App, error) {
	if _, err := o.App(ctx, u, name); err != nil {
		return nil, err
	}
	var updated *appv1.App
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a := &appv1.App{}
		if err := o.Client.Get(ctx, o.key(name), a); err != nil {
			if apierrors.IsNotFound(err) {
				return Fail(NotFound, "no app %q: apps:list shows the apps you can use", name)
			}
			return err
		}
		if !CanAccess(u, a) {
			return Fail(Forbidden, "user %s has no access to app %s", u.Name, name)
		}
		if err := change(a); err != nil {
			return err
		}
		if err := o.Client.Update(ctx, a); err != nil {
			return err
		}
		updated = a
		return nil
	})
	if err != nil {
		if apierrors.IsInvalid(err) {
			return nil, Fail(Invalid, "the API refused the change of %s: %s", name, apierrors.ReasonForError(err))
		}
		if apierrors.IsConflict(err) {
			return nil, Fail(Conflict, "%s changed too often meanwhile: try again", name)
		}
		return nil, err
	}
	rv := updated.ResourceVersion
	return updated, o.WaitCached(ctx, name, func(a *appv1.App) bool {
		return a != nil && a.UID == updated.UID && (a.ResourceVersion == rv || a.Generation > updated.Generation)
	})
}

// WaitCached waits until the cached app satisfies done (nil app: gone), for at
// most CacheWait. A watch delivers in milliseconds; past the bound the write stands
// and the error says so.
func (o *Ops) WaitCached(ctx context.Context, name string, done func(*appv1.App) bool) error {
	wait := o.CacheWait
	if wait <= 0 {
		// As the gitserver's access.DefaultCacheWait: seconds happen on a loaded machine.
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		a := &appv1.App{}
		err := o.Reader.Get(ctx, o.key(name), a)
		switch {
		case apierrors.IsNotFound(err):
			if done(nil) {
				return nil
			}
		case err == nil && done(a):
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the change of %s was made, but this server's cache has not seen it yet: the next command may not show it", name)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// SetSuspended stops (or starts again) every process of an app.
func (o *Ops) SetSuspended(ctx context.Context, u *gitserver.User, name string, suspended bool) error {
	_, err := o.Update(ctx, u, name, func(app *appv1.App) error {
		app.Spec.Suspended = suspended
		return nil
	})
	return err
}

// Scale sets the replicas of process types, in the order given; no release, as on
// Heroku, since nothing the instances run changes.
func (o *Ops) Scale(ctx context.Context, u *gitserver.User, name string, order []string, want map[string]int32) error {
	for _, t := range order {
		if n := want[t]; n < 0 || n > appv1.MaxReplicas {
			return Fail(Invalid, "%s=%d: the replicas of a process type go from 0 to %d", t, n, appv1.MaxReplicas)
		}
	}
	_, err := o.Update(ctx, u, name, func(app *appv1.App) error {
		for _, t := range order {
			p, ok := app.Spec.Processes[t]
			if !ok {
				if len(app.Spec.Processes) == 0 {
					return Fail(Invalid, "%s has no process types yet: git push deploys it first", app.Name)
				}
				return Fail(Invalid, "%s has no process type %q: its types are %s", app.Name, t, strings.Join(SortedKeys(app.Spec.Processes), ", "))
			}
			p.Replicas = want[t]
			app.Spec.Processes[t] = p
		}
		return nil
	})
	return err
}

// ResourceInfo is what one instance of a process type may use, defaults
// included, as ps, apps:info and app_status show it.
type ResourceInfo struct {
	// Memory is the memory limit as a quantity ("512Mi"), MemoryBytes in bytes.
	Memory      string `json:"memory"`
	MemoryBytes int64  `json:"memoryBytes"`
	// CPU is the CPU cap in CPUs ("2", "500m"), or "" for none.
	CPU string `json:"cpu"`
	// Default is true when the type sets nothing and has the platform's defaults.
	Default bool `json:"default"`
}

// ResourcesOf is the ResourceInfo of p.
func ResourcesOf(p appv1.ProcessSpec) ResourceInfo {
	ri := ResourceInfo{MemoryBytes: p.MemoryBytes(), Default: p.Resources == nil || (p.Resources.Memory == nil && p.Resources.CPU == nil)}
	ri.Memory = resource.NewQuantity(ri.MemoryBytes, resource.BinarySI).String()
	if m := p.CPUMillis(); m > 0 {
		ri.CPU = resource.NewMilliQuantity(m, resource.DecimalSI).String()
	}
	return ri
}

// ResourceChange is what ps:resources sets: a nil field is left as it is.
type ResourceChange struct {
	// Memory sets the memory limit; ResetMemory goes back to the default.
	Memory      *resource.Quantity
	ResetMemory bool
	// CPU sets the CPU cap; NoCPU removes it.
	CPU   *resource.Quantity
	NoCPU bool
}

// SetResources changes the limits of one process type; no release, as for
// Scale: the instances are replaced with ones that have the new limits, healthy
// before the old ones stop.
func (o *Ops) SetResources(ctx context.Context, u *gitserver.User, name, process string, ch ResourceChange) (ResourceInfo, error) {
	if ch.Memory != nil {
		if v := ch.Memory.Value(); v < appv1.MinMemory || v > appv1.MaxMemory {
			return ResourceInfo{}, Fail(Invalid, "memory %s: the limit of an instance goes from 16Mi to 64Gi", ch.Memory.String())
		}
	}
	if ch.CPU != nil {
		if m := ch.CPU.MilliValue(); m < appv1.MinCPUMillis || m > appv1.MaxCPUMillis {
			return ResourceInfo{}, Fail(Invalid, "cpu %s: the CPUs of an instance go from 10m (a hundredth) to 64", ch.CPU.String())
		}
	}
	var out ResourceInfo
	_, err := o.Update(ctx, u, name, func(app *appv1.App) error {
		p, ok := app.Spec.Processes[process]
		if !ok {
			if len(app.Spec.Processes) == 0 {
				return Fail(Invalid, "%s has no process types yet: git push deploys it first", app.Name)
			}
			return Fail(Invalid, "%s has no process type %q: its types are %s", app.Name, process, strings.Join(SortedKeys(app.Spec.Processes), ", "))
		}
		r := &appv1.Resources{}
		if p.Resources != nil {
			r = p.Resources.DeepCopy()
		}
		switch {
		case ch.ResetMemory:
			r.Memory = nil
		case ch.Memory != nil:
			q := ch.Memory.DeepCopy()
			r.Memory = &q
		}
		switch {
		case ch.NoCPU:
			r.CPU = nil
		case ch.CPU != nil:
			q := ch.CPU.DeepCopy()
			r.CPU = &q
		}
		if r.Memory == nil && r.CPU == nil {
			r = nil
		}
		before := ResourcesOf(p)
		p.Resources = r
		out = ResourcesOf(p)
		if out == before && (p.Resources == nil) == before.Default {
			return ErrNoChange
		}
		app.Spec.Processes[process] = p
		return nil
	})
	if errors.Is(err, ErrNoChange) {
		return out, nil
	}
	return out, err
}

// RollbackTarget picks the release a rollback of app brings back: to when not 0
// (it must exist), else the newest release before the current one that served.
func (o *Ops) RollbackTarget(ctx context.Context, app *appv1.App, to int64) (int64, error) {
	rels, err := o.Releases.List(ctx, app.Name)
	if err != nil {
		return 0, fmt.Errorf("listing the releases of %s: %w", app.Name, err)
	}
	if to != 0 {
		if !slices.ContainsFunc(rels, func(r appv1.Release) bool { return r.Spec.Number == to }) {
			return 0, Fail(NotFound, "%s has no release v%d to roll back to (releases %s lists them; old ones are pruned)", app.Name, to, app.Name)
		}
	} else {
		for _, r := range rels { // newest first; a release that never served is no way back
			if r.Spec.Number < app.Spec.Release && r.Annotations[releases.AnnotationFailed] == "" {
				to = r.Spec.Number
				break
			}
		}
		if to == 0 {
			return 0, Fail(Invalid, "%s has no release before v%d to roll back to (releases %s lists them)", app.Name, app.Spec.Release, app.Name)
		}
	}
	if to == app.Spec.Release {
		return 0, Fail(Conflict, "v%d is the current release of %s already", to, app.Name)
	}
	return to, nil
}

// SortedKeys returns m's keys in order.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Failed is the Kind of a build or rollout that did not come to serve; the
// previous release keeps serving.
const Failed Kind = "failed"

// ChangeConfig records a release of app whose config vars are edit of the current
// ones (cause Config), or, before the app's first deploy, edits the spec for the
// first release to take (release 0). edit runs on the App as read for the write,
// so concurrent changes are not lost.
func (o *Ops) ChangeConfig(ctx context.Context, u *gitserver.User, app *appv1.App, edit func([]appv1.EnvVar) []appv1.EnvVar, desc string) (int64, error) {
	if app.Spec.Image == "" {
		// Nothing runs yet, so there is nothing to restart: the first push's
		// release takes the config from the spec.
		_, err := o.Update(ctx, u, app.Name, func(a *appv1.App) error {
			a.Spec.Env = edit(a.Spec.Env)
			return nil
		})
		return 0, err
	}
	n, err := o.Releases.Record(ctx, app.Name, releases.Change{
		EditEnv: func(env []appv1.EnvVar) ([]appv1.EnvVar, error) { return edit(env), nil },
		Cause:   appv1.ReleaseCauseConfig, Actor: u.Name, Description: desc,
	})
	if err != nil {
		return 0, fmt.Errorf("recording the release of %s: %w", app.Name, err)
	}
	return n, nil
}

// Await waits up to timeout for release n of app to serve and returns its URL; a
// release that fails is withdrawn (releases.Recorder.Await) and reported as Failed.
func (o *Ops) Await(ctx context.Context, app string, n int64, timeout time.Duration, progress func(string)) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url, err := o.Releases.Await(wctx, app, n, progress)
	switch {
	case errors.Is(err, releases.ErrRolloutFailed):
		return "", Fail(Failed, "release v%d of %s did not roll out: %s; the previous release keeps serving", n, app, strings.TrimPrefix(err.Error(), releases.ErrRolloutFailed.Error()+": "))
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return "", Fail(Failed, "release v%d of %s is not serving after %s: it may still come up (apps:info %s)", n, app, timeout, app)
	}
	return url, err
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckEnvName refuses what cannot be a config var's name.
func CheckEnvName(k string) error {
	if len(k) > 256 || !envNameRE.MatchString(k) {
		return Fail(Invalid, "%q is not a config var name: use letters, digits and '_', not starting with a digit (as a shell variable)", k)
	}
	return nil
}
