package backend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

func noSuchProcess(a *appv1.App, t string) error {
	if len(a.Spec.Processes) == 0 {
		return Errorf(Invalid, "%s has no process types yet: git push deploys it first", a.Name)
	}
	return Errorf(Invalid, "%s has no process type %q: its types are %s", a.Name, t, strings.Join(slices.Sorted(maps.Keys(a.Spec.Processes)), ", "))
}

// Processes is an app's process types, their scale and limits.
func (b *Backend) Processes(ctx context.Context, u *User, name string) (*Processes, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	out := &Processes{App: a.Name, Phase: phase(a), Revision: a.Status.Revision, Suspended: a.Spec.Suspended, Processes: processesOf(a)}
	out.Trouble, out.TroubleMessage = trouble(a)
	return out, nil
}

// SetSuspended stops (or starts again) every process of an app.
func (b *Backend) SetSuspended(ctx context.Context, u *User, name string, suspended bool) error {
	op := "resume"
	if suspended {
		op = "suspend"
	}
	if err := u.mayChange(op); err != nil {
		return err
	}
	_, err := b.update(ctx, u, name, func(app *appv1.App) error {
		app.Spec.Suspended = suspended
		return nil
	})
	if err != nil {
		return err
	}
	b.audit(u, op, name)
	return nil
}

// Scale sets the replicas of process types, in the order given; no release, as
// on Heroku, since nothing the instances run changes. It returns the processes
// as they are then.
func (b *Backend) Scale(ctx context.Context, u *User, name string, order []string, want map[string]int32) ([]ProcessInfo, error) {
	if err := u.mayChange("ps:scale"); err != nil {
		return nil, err
	}
	if len(order) == 0 {
		return nil, Errorf(Invalid, "nothing to scale: give TYPE=N, e.g. web=2")
	}
	for _, t := range order {
		if n := want[t]; n < 0 || n > appv1.MaxReplicas {
			return nil, Errorf(Invalid, "%s=%d: the replicas of a process type go from 0 to %d", t, n, appv1.MaxReplicas)
		}
	}
	a, err := b.update(ctx, u, name, func(app *appv1.App) error {
		for _, t := range order {
			p, ok := app.Spec.Processes[t]
			if !ok {
				return noSuchProcess(app, t)
			}
			p.Replicas = want[t]
			app.Spec.Processes[t] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(order))
	for i, t := range order {
		parts[i] = fmt.Sprintf("%s=%d", t, want[t])
	}
	b.audit(u, "ps:scale", name, "scale", strings.Join(parts, " "))
	return processesOf(a), nil
}

// Resources is what each instance of one process type of an app may use.
func (b *Backend) Resources(ctx context.Context, u *User, name, process string) (ResourceInfo, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return ResourceInfo{}, err
	}
	p, ok := a.Spec.Processes[process]
	if !ok {
		return ResourceInfo{}, noSuchProcess(a, process)
	}
	return resourcesOf(p), nil
}

// ResourceChange is a change of a process type's limits: a nil field is left
// as it is.
type ResourceChange struct {
	// Memory sets the memory limit; ResetMemory goes back to the default.
	Memory      *resource.Quantity
	ResetMemory bool
	// CPU sets the CPU cap; NoCPU removes it.
	CPU   *resource.Quantity
	NoCPU bool
}

// IsZero reports whether ch changes nothing.
func (ch ResourceChange) IsZero() bool {
	return ch.Memory == nil && !ch.ResetMemory && ch.CPU == nil && !ch.NoCPU
}

func (ch ResourceChange) String() string {
	var parts []string
	switch {
	case ch.ResetMemory:
		parts = append(parts, "memory default")
	case ch.Memory != nil:
		parts = append(parts, "memory "+ch.Memory.String())
	}
	switch {
	case ch.NoCPU:
		parts = append(parts, "cpu none")
	case ch.CPU != nil:
		parts = append(parts, "cpu "+ch.CPU.String())
	}
	return strings.Join(parts, " ")
}

// SetResources changes the limits of one process type; no release, as for
// Scale: the instances are replaced with ones that have the new limits, healthy
// before the old ones stop.
func (b *Backend) SetResources(ctx context.Context, u *User, name, process string, ch ResourceChange) (ResourceInfo, error) {
	if err := u.mayChange("ps:resources"); err != nil {
		return ResourceInfo{}, err
	}
	if ch.Memory != nil {
		if v := ch.Memory.Value(); v < appv1.MinMemory || v > appv1.MaxMemory {
			return ResourceInfo{}, Errorf(Invalid, "memory %s: the limit of an instance goes from 16Mi to 64Gi", ch.Memory.String())
		}
	}
	if ch.CPU != nil {
		if m := ch.CPU.MilliValue(); m < appv1.MinCPUMillis || m > appv1.MaxCPUMillis {
			return ResourceInfo{}, Errorf(Invalid, "cpu %s: the CPUs of an instance go from 10m (a hundredth) to 64", ch.CPU.String())
		}
	}
	var out ResourceInfo
	_, err := b.update(ctx, u, name, func(app *appv1.App) error {
		p, ok := app.Spec.Processes[process]
		if !ok {
			return noSuchProcess(app, process)
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
		before := resourcesOf(p)
		p.Resources = r
		out = resourcesOf(p)
		if out == before && (p.Resources == nil) == before.Default {
			return errNoChange
		}
		app.Spec.Processes[process] = p
		return nil
	})
	if errors.Is(err, errNoChange) {
		return out, nil
	}
	if err != nil {
		return ResourceInfo{}, err
	}
	b.audit(u, "ps:resources", name, "type", process, "resources", ch.String())
	return out, nil
}

// Restart replaces an app's instances (of one process type when process is not
// empty) with fresh ones: an annotation the deployer passes to its runtime.
func (b *Backend) Restart(ctx context.Context, u *User, name, process string) error {
	if err := u.mayChange("ps:restart"); err != nil {
		return err
	}
	key := appv1.RestartedAtAnnotation
	if process != "" {
		key += "." + process
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	_, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if process != "" {
			if _, ok := app.Spec.Processes[process]; !ok {
				return noSuchProcess(app, process)
			}
		}
		if app.Annotations == nil {
			app.Annotations = map[string]string{}
		}
		app.Annotations[key] = now
		return nil
	})
	if err != nil {
		return err
	}
	b.audit(u, "ps:restart", name, "annotation", key)
	return nil
}
