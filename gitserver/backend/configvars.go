package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// checkEnvName refuses what cannot be a config var's name.
func checkEnvName(k string) error {
	if !appv1.ValidEnvName(k) {
		return Errorf(Invalid, "%q is not a config var name: use letters, digits and '_', not starting with a digit (as a shell variable)", k)
	}
	return nil
}

// Config is an app's config vars, in order.
func (b *Backend) Config(ctx context.Context, u *User, name string) (*ConfigList, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	out := &ConfigList{App: a.Name, Config: []ConfigVar{}}
	for _, e := range a.Spec.Env {
		out.Config = append(out.Config, configVarOf(e))
	}
	return out, nil
}

// ConfigVar is one config var of an app.
func (b *Backend) ConfigVar(ctx context.Context, u *User, name, key string) (*ConfigVar, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if err := checkEnvName(key); err != nil {
		return nil, err
	}
	i := slices.IndexFunc(a.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == key })
	if i < 0 {
		return nil, Errorf(NotFound, "%s is not set on %s (config %s lists what is)", key, a.Name, a.Name)
	}
	v := configVarOf(a.Spec.Env[i])
	return &v, nil
}

// ConfigValues are the values of app's config vars, by name, for one use only:
// masking them in what the agents' API shows of the app's output
// (gitserver/untrusted's Redactor). They are never to be returned to a client:
// no MCP tool shows a config value, and config tools say names.
//
// A literal value is the App's (spec.env, what the app's processes and
// one-offs run with), and, under "NAME (vN)", a kept release's that differs
// from it (a withdrawn release's instances printed theirs). A value taken from a Secret (a database link's URL) is
// read through Config.ConfigSecrets, and for a database's credentials its
// password is added too, under "NAME password" (an app may print it alone);
// without ConfigSecrets (a cluster, whose gitserver may not read the apps'
// Secrets) those values are left out, as is a Secret or key not made yet. It
// is a read of the app, with its access rules and the token's scope.
func (b *Backend) ConfigValues(ctx context.Context, u *User, name string) (map[string]string, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(a.Spec.Env))
	secrets := map[string]*corev1.Secret{}
	for _, e := range a.Spec.Env {
		if e.ValueFrom == nil {
			out[e.Name] = e.Value
			continue
		}
		if b.cfg.ConfigSecrets == nil {
			continue
		}
		s, read := secrets[e.ValueFrom.Name]
		if !read {
			s = &corev1.Secret{}
			err := b.cfg.ConfigSecrets.Get(ctx, client.ObjectKey{Namespace: b.cfg.Namespace, Name: e.ValueFrom.Name}, s)
			switch {
			case apierrors.IsNotFound(err):
				s = nil // not made yet: the app has no value from it either
			case err != nil:
				return nil, fmt.Errorf("reading the secret %s of config var %s of %s: %w", e.ValueFrom.Name, e.Name, a.Name, err)
			}
			secrets[e.ValueFrom.Name] = s
		}
		if s == nil {
			continue
		}
		if v, ok := s.Data[e.ValueFrom.Key]; ok {
			out[e.Name] = string(v)
		}
		if _, db := appv1.DatabaseOfSecret(e.ValueFrom.Name); db && e.ValueFrom.Key != appv1.CredentialPassword {
			if pw, ok := s.Data[appv1.CredentialPassword]; ok {
				out[e.Name+" password"] = string(pw)
			}
		}
	}
	// The values of the app's kept releases too, under "NAME (vN)" where they
	// differ from today's: a failed release is withdrawn (the App goes back to
	// the config that served), yet its instances' last lines, which failures
	// quote, and older releases' lines in the logs print what they ran with.
	var rels []appv1.Release
	if b.cfg.Releases != nil {
		rels, _ = b.cfg.Releases.List(ctx, a.Name) // none read: today's values alone
	}
	for _, r := range rels {
		for _, e := range r.Spec.Config.Env {
			if e.ValueFrom == nil && e.Value != "" && out[e.Name] != e.Value {
				out[fmt.Sprintf("%s (v%d)", e.Name, r.Spec.Number)] = e.Value
			}
		}
	}
	return out, nil
}

// EnvVar is one config var to set.
type EnvVar struct{ Name, Value string }

// ConfigChange is a change of an app's config vars: Set in order (a name given
// twice takes its last value), then Unset.
type ConfigChange struct {
	Set   []EnvVar
	Unset []string
	// Progress, when not nil, receives the output of the app's release command,
	// which runs with the new config before the release is recorded.
	Progress io.Writer
}

// ConfigResult is a recorded config change.
type ConfigResult struct {
	// Release is the new release, or 0 before the app's first deploy: the spec
	// then holds the vars for the first release to take.
	Release int64
	// Description says what changed ("Set A, B; Unset C").
	Description string
	// NotSet are the names to unset that were not set (nothing to do for them).
	NotSet []string
}

// ChangeConfig records a release of app whose config vars are the current ones
// with ch applied (cause Config), or, before the app's first deploy, edits the
// spec for the first release to take. A change that changes nothing (only
// names that are not set) records nothing: Description is then "". Await the
// release with Await.
func (b *Backend) ChangeConfig(ctx context.Context, u *User, name string, ch ConfigChange) (*ConfigResult, error) {
	if err := u.mayChange("config:set"); err != nil {
		return nil, err
	}
	if len(ch.Set) == 0 && len(ch.Unset) == 0 {
		return nil, Errorf(Invalid, "nothing to change: give config vars to set or unset")
	}
	var set []string
	for _, v := range ch.Set {
		if err := checkEnvName(v.Name); err != nil {
			return nil, err
		}
		if len(v.Value) > appv1.MaxEnvValueBytes {
			return nil, Errorf(Invalid, "the value of %s is %d bytes; at most %d fit", v.Name, len(v.Value), appv1.MaxEnvValueBytes)
		}
		if !slices.Contains(set, v.Name) {
			set = append(set, v.Name)
		}
	}
	for _, k := range ch.Unset {
		if err := checkEnvName(k); err != nil {
			return nil, err
		}
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	res := &ConfigResult{}
	var unset []string
	for _, k := range ch.Unset {
		switch {
		case slices.Contains(unset, k):
		case slices.ContainsFunc(a.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == k }) || slices.Contains(set, k):
			unset = append(unset, k)
		default:
			res.NotSet = append(res.NotSet, k)
		}
	}
	if len(set) == 0 && len(unset) == 0 {
		return res, nil
	}
	var parts []string
	if len(set) > 0 {
		parts = append(parts, "Set "+strings.Join(set, ", "))
	}
	if len(unset) > 0 {
		parts = append(parts, "Unset "+strings.Join(unset, ", "))
	}
	res.Description = strings.Join(parts, "; ")
	edit := func(env []appv1.EnvVar) []appv1.EnvVar {
		for _, v := range ch.Set {
			if i := slices.IndexFunc(env, func(e appv1.EnvVar) bool { return e.Name == v.Name }); i >= 0 {
				env[i] = appv1.EnvVar{Name: v.Name, Value: v.Value}
			} else {
				env = append(env, appv1.EnvVar{Name: v.Name, Value: v.Value})
			}
		}
		return slices.DeleteFunc(env, func(e appv1.EnvVar) bool { return slices.Contains(unset, e.Name) })
	}
	op := "config:set"
	if len(set) == 0 {
		op = "config:unset"
	}
	n, err := b.recordConfig(ctx, u, a, op, res.Description, edit, ch.Progress, "set", set, "unset", unset)
	if err != nil {
		return nil, err
	}
	res.Release = n
	return res, nil
}

// recordConfig records a release of a whose config vars are edit of the
// current ones (cause Config, description saying what changed), edit running
// on the App as read for the write; or, before a's first deploy, edits its
// spec for the first release to take, and returns release 0. op and attrs make
// the audit line. Config changes and database links both go through it.
func (b *Backend) recordConfig(ctx context.Context, u *User, a *appv1.App, op, description string, edit func([]appv1.EnvVar) []appv1.EnvVar, progress io.Writer, attrs ...any) (int64, error) {
	if a.Spec.Image == "" {
		// Nothing runs yet, so there is nothing to restart: the first push's
		// release takes the config from the spec.
		if _, err := b.update(ctx, u, a.Name, func(a *appv1.App) error {
			a.Spec.Env = edit(a.Spec.Env)
			return nil
		}); err != nil {
			return 0, err
		}
		b.audit(u, op, a.Name, append(attrs, "before", a.Status.Revision)...)
		return 0, nil
	}
	if err := wouldChange(ctx, func(p *Plan) {
		p.Config = configDiff(a.Spec.Env, edit(slices.Clone(a.Spec.Env)))
		p.Release, p.ServingRelease = b.nextRelease(ctx, a), a.Status.Revision
		p.Changes = append(p.Config.sentences(), fmt.Sprintf("would record release v%d with them and roll it out; v%d would keep serving until its instances are healthy", p.Release, a.Status.Revision))
	}); err != nil {
		return 0, err
	}
	n, err := b.cfg.Releases.RecordConfig(ctx, a.Name, edit, u.Name, description, progress)
	if rc, ok := errors.AsType[ReleaseCommandFailure](err); ok {
		// The release ran its release command, which failed: nothing else
		// changed.
		return 0, &Error{Kind: Failed, Msg: fmt.Sprintf("%v; the config is unchanged and the release that served keeps serving", err),
			Err: StoppedAt(err, Stop{Phase: PhaseRelease, Release: rc.ReleaseCommandFailed()})}
	}
	if err != nil {
		return 0, fmt.Errorf("recording the release of %s: %w", a.Name, err)
	}
	b.audit(u, op, a.Name, append(attrs, "before", a.Status.Revision, "release", n)...)
	return n, nil
}
