package backend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Plan is what a change would do, answered by a dry run (DryRun) in place of
// doing it. It names config vars, never their values.
type Plan struct {
	DryRun bool `json:"dry_run" jsonschema:"always true: nothing was changed"`
	// Changes says what would change, a sentence each; empty when nothing
	// would (the change is made already).
	Changes []string `json:"changes" jsonschema:"what would change, a sentence each; empty: nothing would"`
	// Release is the release the change would make, 0 when it makes none;
	// ServingRelease the one that serves now.
	Release        int64 `json:"release,omitempty" jsonschema:"the release the change would make (0: none)"`
	ServingRelease int64 `json:"serving_release,omitempty"`
	// RollbackTo is the release a rollback would bring back, with its image;
	// Config then says how its config differs from today's.
	RollbackTo *ReleaseInfo `json:"rollback_to,omitempty"`
	// Image is what a deploy_image would pull (resolved to a digest only when
	// it runs); Commit what a deploy would build (empty: the deploy branch's
	// tip, fetched first from Upstream when the app has one).
	Image    string `json:"image,omitempty"`
	Commit   string `json:"commit,omitempty"`
	Branch   string `json:"branch,omitempty"`
	Upstream string `json:"upstream,omitempty"`
	// Config is how the config vars would change, by name.
	Config *ConfigDiff `json:"config,omitempty"`
	// Scale is each process type's replicas before and after.
	Scale []ScaleChange `json:"scale,omitempty"`
	// Volume is a volume that would be made or would go, with its files.
	Volume *VolumeInfo `json:"volume,omitempty"`
	// Database is a database that would be made.
	Database *DatabaseInfo `json:"database,omitempty"`
	// Command is what a run would start.
	Command []string `json:"command,omitempty"`
}

// ConfigDiff names the config vars a change adds, changes and removes.
type ConfigDiff struct {
	Added   []string `json:"added"`
	Changed []string `json:"changed"`
	Removed []string `json:"removed"`
}

// ScaleChange is one process type's replicas before and after.
type ScaleChange struct {
	Process string `json:"process"`
	From    int32  `json:"from"`
	To      int32  `json:"to"`
}

type dryRunKey struct{}

// errDryRun ends a change at the point where it would write, in a dry run.
var errDryRun = errors.New("dry run: nothing was changed")

// DryRun runs change (a call of one of the backend's changing operations with
// the context it is given) as a dry run: every check and read the change
// makes, the same refusals, and at the point where it would write, the Plan of
// what it would do instead. Nothing is written: the operations stop before
// their first write, and the backend's API client refuses any write a dry run
// reaches all the same (dryRunGuard), so that a path that forgot to stop
// fails rather than changes.
func DryRun(ctx context.Context, change func(ctx context.Context) error) (*Plan, error) {
	p := &Plan{DryRun: true, Changes: []string{}}
	err := change(context.WithValue(ctx, dryRunKey{}, p))
	switch {
	case errors.Is(err, errDryRun):
		return p, nil
	case err != nil:
		return nil, err
	}
	// It ended before any write: nothing to change (a config var unset that is
	// not set, a link made already).
	return p, nil
}

// planOf is the plan of ctx's dry run, nil outside one.
func planOf(ctx context.Context) *Plan {
	p, _ := ctx.Value(dryRunKey{}).(*Plan)
	return p
}

// wouldChange ends a change where it would write, in a dry run: fill says
// what it would do, and errDryRun is returned. Outside a dry run it returns
// nil and the change goes on.
func wouldChange(ctx context.Context, fill func(p *Plan)) error {
	p := planOf(ctx)
	if p == nil {
		return nil
	}
	fill(p)
	return errDryRun
}

// configDiff names what after changes of before's config vars.
func configDiff(before, after []appv1.EnvVar) *ConfigDiff {
	d := &ConfigDiff{Added: []string{}, Changed: []string{}, Removed: []string{}}
	old := map[string]appv1.EnvVar{}
	for _, e := range before {
		old[e.Name] = e
	}
	seen := map[string]bool{}
	for _, e := range after {
		seen[e.Name] = true
		o, ok := old[e.Name]
		switch {
		case !ok:
			d.Added = append(d.Added, e.Name)
		case o.Value != e.Value || !sameSource(o.ValueFrom, e.ValueFrom):
			d.Changed = append(d.Changed, e.Name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(old)) {
		if !seen[name] {
			d.Removed = append(d.Removed, name)
		}
	}
	return d
}

func sameSource(a, b *appv1.SecretKeySelector) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// sentences says d as the plan's sentences.
func (d *ConfigDiff) sentences() []string {
	var out []string
	if len(d.Added) > 0 {
		out = append(out, "would add the config vars "+strings.Join(d.Added, ", "))
	}
	if len(d.Changed) > 0 {
		out = append(out, "would change the values of "+strings.Join(d.Changed, ", "))
	}
	if len(d.Removed) > 0 {
		out = append(out, "would remove the config vars "+strings.Join(d.Removed, ", "))
	}
	return out
}

// planApp fills p with what after changes of before, both the App's spec
// (an update's dry run): suspension, replicas, volumes, config vars.
func planApp(p *Plan, before, after *appv1.App) {
	p.ServingRelease = before.Status.Revision
	if before.Spec.Suspended != after.Spec.Suspended {
		if after.Spec.Suspended {
			p.Changes = append(p.Changes, fmt.Sprintf("would stop every process of %s; the edge would answer 503 until resume", after.Name))
		} else {
			p.Changes = append(p.Changes, fmt.Sprintf("would start the processes of %s again, on release v%d", after.Name, after.Spec.Release))
		}
	}
	for _, t := range slices.Sorted(maps.Keys(after.Spec.Processes)) {
		from, to := before.Spec.Processes[t].Replicas, after.Spec.Processes[t].Replicas
		if from != to {
			p.Scale = append(p.Scale, ScaleChange{Process: t, From: from, To: to})
			p.Changes = append(p.Changes, fmt.Sprintf("would scale %s from %d to %d", t, from, to))
		}
	}
	for _, v := range after.Spec.Volumes {
		if _, ok := findVolume(before, v.Name); !ok {
			p.Changes = append(p.Changes, fmt.Sprintf("would make the volume %s (%s) mounted at %s", v.Name, v.Size.String(), v.Path))
		}
	}
	for _, v := range before.Spec.Volumes {
		if _, ok := findVolume(after, v.Name); !ok {
			p.Changes = append(p.Changes, fmt.Sprintf("would delete the volume %s (mounted at %s) and its files, for good", v.Name, v.Path))
		}
	}
	if d := configDiff(before.Spec.Env, after.Spec.Env); len(d.Added)+len(d.Changed)+len(d.Removed) > 0 {
		p.Config = d
		p.Changes = append(p.Changes, d.sentences()...)
		if after.Spec.Image == "" {
			p.Changes = append(p.Changes, "no release yet: the first deploy would take them")
		}
	}
}

// nextRelease is the number the next release of app would have.
func (b *Backend) nextRelease(ctx context.Context, a *appv1.App) int64 {
	n := a.Spec.Release
	if rels, err := b.cfg.Releases.List(ctx, a.Name); err == nil && len(rels) > 0 {
		n = max(n, rels[0].Spec.Number)
	}
	return n + 1
}

// dryRunGuard is the backend's API client: in a dry run it refuses every
// write that is not itself a dry run of the API server's (client.DryRunAll),
// so that an operation that forgot to stop at wouldChange fails instead of
// changing anything.
type dryRunGuard struct{ client.Client }

func refuseInDryRun(ctx context.Context, verb string, obj runtime.Object, serverDryRun bool) error {
	if planOf(ctx) == nil || serverDryRun {
		return nil
	}
	return fmt.Errorf("a dry run reached a write (%s %T): refused", verb, obj)
}

func (g dryRunGuard) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	o := &client.CreateOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "create", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.Create(ctx, obj, opts...)
}

func (g dryRunGuard) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	o := &client.UpdateOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "update", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.Update(ctx, obj, opts...)
}

func (g dryRunGuard) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	o := &client.PatchOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "patch", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.Patch(ctx, obj, patch, opts...)
}

func (g dryRunGuard) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	o := &client.ApplyOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "apply", nil, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.Apply(ctx, obj, opts...)
}

func (g dryRunGuard) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	o := &client.DeleteOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "delete", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.Delete(ctx, obj, opts...)
}

func (g dryRunGuard) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	o := &client.DeleteAllOfOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "delete", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return g.Client.DeleteAllOf(ctx, obj, opts...)
}

func (g dryRunGuard) Status() client.SubResourceWriter {
	return g.SubResource("status")
}

func (g dryRunGuard) SubResource(sub string) client.SubResourceClient {
	return guardedSubResource{g.Client.SubResource(sub)}
}

type guardedSubResource struct{ client.SubResourceClient }

func (s guardedSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	o := &client.SubResourceCreateOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "create", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return s.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (s guardedSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	o := &client.SubResourceUpdateOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "update", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return s.SubResourceClient.Update(ctx, obj, opts...)
}

func (s guardedSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	o := &client.SubResourcePatchOptions{}
	o.ApplyOptions(opts)
	if err := refuseInDryRun(ctx, "patch", obj, len(o.DryRun) > 0); err != nil {
		return err
	}
	return s.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

func (s guardedSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	o := &client.SubResourceApplyOptions{}
	o.ApplyOpts(opts)
	if err := refuseInDryRun(ctx, "apply", nil, len(o.DryRun) > 0); err != nil {
		return err
	}
	return s.SubResourceClient.Apply(ctx, obj, opts...)
}
