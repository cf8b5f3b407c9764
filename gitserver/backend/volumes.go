package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// VolumeStore reads and replaces the contents of volumes where they live: on
// one machine the local runtime's Volumes, on a cluster a helper pod per
// transfer (deployer/runtime/kube VolumeData); cmd/bex adapts them. The deployer
// makes and deletes them from spec.volumes; this is for what a person asks of
// one.
type VolumeStore interface {
	// Usage is the volume's bytes in use and its size; used is -1 when this
	// server cannot measure it (a cluster: the file system is on a node). An
	// error wrapping fs.ErrNotExist when the volume does not exist (yet) where
	// this server looks.
	Usage(ctx context.Context, app, name string) (used, size int64, err error)
	// Backup writes the volume's contents to w as a tar archive: one moment of
	// the volume when Pauses, else a copy taken while the app runs (writes in
	// flight may be missed; a suspended app's is still).
	Backup(ctx context.Context, app, name string, w io.Writer) error
	// Restore replaces the volume's contents with the tar archive read from r.
	// An archive it refuses (malformed, an entry outside the volume, too big
	// for it) is an Invalid error and changes nothing. Unless Pauses, the app
	// runs meanwhile.
	Restore(ctx context.Context, app, name string, r io.Reader) error
	// Pauses reports whether Backup and Restore pause the app's containers
	// that mount the volume (one machine: the cgroup freezer). False on a
	// cluster, where nothing pauses pods: the backend then refuses a running
	// app's copy unless asked for --live, and says `suspend APP` first gives a
	// still one.
	Pauses() bool
}

// VolumeInfo is one volume of an app, as volumes --json shows it.
type VolumeInfo struct {
	Name string `json:"name"`
	Path string `json:"path" jsonschema:"where it is mounted in the instances"`
	// Size is the size as asked (e.g. 10Gi), SizeBytes the same in bytes.
	Size      string `json:"size"`
	SizeBytes int64  `json:"sizeBytes"`
	// UsedBytes is what its file system has in use, when this server can
	// measure it (null otherwise).
	UsedBytes *int64 `json:"usedBytes"`
	// Processes are the process types that mount it; empty: all of them.
	Processes []string `json:"processes"`
	// Ready is true once the deployer made it; Message says why not.
	Ready   bool   `json:"ready"`
	Message string `json:"message,omitempty"`
}

// VolumeRequest is what volumes:create asks for.
type VolumeRequest struct {
	Name string
	Path string
	// Size is a quantity (10Gi); empty: DefaultVolumeSize.
	Size string
	// Processes are the process types that mount it; empty: all.
	Processes []string
}

func noSuchVolume(a *appv1.App, name string) error {
	if len(a.Spec.Volumes) == 0 {
		return Errorf(NotFound, "%s has no volumes: volumes:create %s NAME --path /data makes one", a.Name, a.Name)
	}
	names := make([]string, len(a.Spec.Volumes))
	for i, v := range a.Spec.Volumes {
		names[i] = v.Name
	}
	return Errorf(NotFound, "%s has no volume %q: its volumes are %s", a.Name, name, strings.Join(names, ", "))
}

func findVolume(a *appv1.App, name string) (appv1.Volume, bool) {
	for _, v := range a.Spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return appv1.Volume{}, false
}

func volumeStatus(a *appv1.App, name string) (appv1.VolumeStatus, bool) {
	for _, s := range a.Status.Volumes {
		if s.Name == name {
			return s, true
		}
	}
	return appv1.VolumeStatus{}, false
}

// Volumes lists an app's volumes with their usage.
func (b *Backend) Volumes(ctx context.Context, u *User, name string) ([]VolumeInfo, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	out := make([]VolumeInfo, 0, len(a.Spec.Volumes))
	for _, v := range a.Spec.Volumes {
		out = append(out, b.volumeInfo(ctx, a, v))
	}
	return out, nil
}

func (b *Backend) volumeInfo(ctx context.Context, a *appv1.App, v appv1.Volume) VolumeInfo {
	in := VolumeInfo{Name: v.Name, Path: v.Path, Size: v.Size.String(), SizeBytes: v.Size.Value(), Processes: nonNil(v.Processes)}
	if s, ok := volumeStatus(a, v.Name); ok {
		in.Ready, in.Message = s.Ready, s.Message
	} else if a.Spec.Image == "" {
		in.Message = "made at the first deploy"
	} else {
		in.Message = "being made"
	}
	if b.cfg.Volumes != nil {
		if used, _, err := b.cfg.Volumes.Usage(ctx, a.Name, v.Name); err == nil && used >= 0 {
			in.UsedBytes = &used
		}
	}
	return in
}

// CreateVolume adds a volume to an app's spec and waits until the deployer made
// it and the instances that mount it serve; an app not deployed yet gets it at
// its first deploy. A volume the deployer cannot make (no room on the disk) is
// taken out of the spec again, and the error says why.
func (b *Backend) CreateVolume(ctx context.Context, u *User, app string, req VolumeRequest, progress func(string)) (*VolumeInfo, error) {
	if err := u.mayChange("volumes:create"); err != nil {
		return nil, err
	}
	if !appv1.ValidVolumeName(req.Name) {
		return nil, Errorf(Invalid, "%q is not a volume name: use %s", req.Name, appv1.VolumeNameRule)
	}
	if req.Path == "" {
		return nil, Errorf(Invalid, "volumes:create needs --path: where the volume is mounted in the app, e.g. --path /data")
	}
	if err := appv1.CheckVolumePath(req.Path); err != nil {
		return nil, Errorf(Invalid, "%v", err)
	}
	size := resource.NewQuantity(appv1.DefaultVolumeSize, resource.BinarySI)
	if req.Size != "" {
		q, err := resource.ParseQuantity(req.Size)
		if err != nil || q.Value() < appv1.MinVolumeSize || q.Value() > appv1.MaxVolumeSize {
			return nil, Errorf(Invalid, "--size %q: give a size from 16Mi to 16Ti, e.g. --size 10Gi", req.Size)
		}
		size = &q
	}
	for _, p := range req.Processes {
		if len(p) > 30 || !appv1.ValidVolumeName(p) {
			return nil, Errorf(Invalid, "--process %q is not a process type name", p)
		}
	}
	v := appv1.Volume{Name: req.Name, Path: req.Path, Size: *size, Processes: slices.Compact(slices.Sorted(slices.Values(req.Processes)))}
	if p := planOf(ctx); p != nil {
		p.Volume = &VolumeInfo{Name: v.Name, Path: v.Path, Size: v.Size.String(), SizeBytes: v.Size.Value(), Processes: v.Processes}
	}
	a, err := b.update(ctx, u, app, func(a *appv1.App) error {
		if _, ok := findVolume(a, v.Name); ok {
			return Errorf(Conflict, "%s has a volume %s already: volumes %s lists them", a.Name, v.Name, a.Name)
		}
		if s, ok := volumeStatus(a, v.Name); ok {
			return Errorf(Conflict, "the volume %s of %s is still being deleted (%s): try again in a moment", v.Name, a.Name, s.Message)
		}
		for _, w := range a.Spec.Volumes {
			if w.Path == v.Path {
				return Errorf(Conflict, "the volume %s of %s is mounted at %s already: pick another --path", w.Name, a.Name, v.Path)
			}
		}
		if len(a.Spec.Volumes) >= appv1.MaxVolumes {
			return Errorf(Invalid, "%s has %d volumes, the most an app may have", a.Name, appv1.MaxVolumes)
		}
		for _, p := range v.Processes {
			if _, ok := a.Spec.Processes[p]; !ok && len(a.Spec.Processes) > 0 {
				return noSuchProcess(a, p)
			}
		}
		a.Spec.Volumes = append(a.Spec.Volumes, v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.audit(u, "volumes:create", app, "volume", v.Name, "path", v.Path, "size", v.Size.String())
	if a.Spec.Image == "" {
		in := b.volumeInfo(ctx, a, v)
		return &in, nil
	}
	if progress != nil {
		progress(fmt.Sprintf("Making %s (%s) and mounting it at %s", v.Name, v.Size.String(), v.Path))
	}
	gen := a.Generation
	var failure string
	err = b.waitApp(ctx, app, func(a *appv1.App) (bool, error) {
		if a == nil {
			return false, noSuchApp(app)
		}
		s, ok := volumeStatus(a, v.Name)
		if a.Status.ObservedGeneration < gen || !ok {
			return false, nil
		}
		if !s.Ready {
			failure = s.Message
			return true, nil
		}
		return rolledOut(a, gen)
	})
	if err != nil {
		return nil, err
	}
	if failure != "" {
		// Out of the spec again, so the app does not stay blocked on it.
		_, rerr := b.update(ctx, u, app, func(a *appv1.App) error {
			a.Spec.Volumes = slices.DeleteFunc(a.Spec.Volumes, func(w appv1.Volume) bool { return w.Name == v.Name })
			return nil
		})
		return nil, errors.Join(Errorf(Failed, "the volume %s of %s could not be made: %s", v.Name, app, failure), rerr)
	}
	a, err = b.app(ctx, u, app)
	if err != nil {
		return nil, err
	}
	in := b.volumeInfo(ctx, a, v)
	return &in, nil
}

// rolledOut reports an app whose status describes generation gen and whose
// instances serve it; an error when its rollout failed.
func rolledOut(a *appv1.App, gen int64) (bool, error) {
	if a.Status.ObservedGeneration < gen {
		return false, nil
	}
	c := meta.FindStatusCondition(a.Status.Conditions, appv1.RolledOutCondition)
	switch {
	case c == nil || c.ObservedGeneration < gen:
		return false, nil
	case c.Status == metav1.ConditionTrue:
		return true, nil
	case c.Reason == appv1.RollingOutReason:
		return false, nil
	default:
		return false, Errorf(Failed, "%s did not roll out: %s", a.Name, c.Message)
	}
}

// waitApp polls the cached app until done says so, for at most RolloutTimeout.
func (b *Backend) waitApp(ctx context.Context, name string, done func(*appv1.App) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RolloutTimeout)
	defer cancel()
	for {
		a := &appv1.App{}
		if err := b.cfg.Reader.Get(ctx, b.key(name), a); err != nil {
			a = nil
		}
		ok, err := done(a)
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return Errorf(Failed, "%s: the deployer did not finish within %v; volumes %s shows where it is", name, b.cfg.RolloutTimeout, name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DestroyVolume takes a volume out of an app's spec; confirm must be its name
// again. The deployer replaces the instances that mounted it, then deletes its
// data; this waits for that, so that a volume made again under the same name
// starts empty.
func (b *Backend) DestroyVolume(ctx context.Context, u *User, app, name, confirm string) error {
	if err := u.mayChange("volumes:destroy"); err != nil {
		return err
	}
	a, err := b.app(ctx, u, app)
	if err != nil {
		return err
	}
	if _, ok := findVolume(a, name); !ok {
		return noSuchVolume(a, name)
	}
	if p := planOf(ctx); p != nil {
		// What would go, with what its files take now; no confirmation is
		// needed to be told.
		v, _ := findVolume(a, name)
		in := b.volumeInfo(ctx, a, v)
		p.Volume = &in
		confirm = name
	}
	if confirm != name {
		return Errorf(Invalid, "this deletes the volume %s of %s and its files for good: to go on, run volumes:destroy %s %s --confirm %s", name, app, app, name, name)
	}
	a, err = b.update(ctx, u, app, func(a *appv1.App) error {
		n := len(a.Spec.Volumes)
		a.Spec.Volumes = slices.DeleteFunc(a.Spec.Volumes, func(v appv1.Volume) bool { return v.Name == name })
		if len(a.Spec.Volumes) == n {
			return noSuchVolume(a, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.audit(u, "volumes:destroy", app, "volume", name)
	if a.Spec.Image == "" {
		return nil // never deployed: the deployer never made it
	}
	gen := a.Generation
	return b.waitApp(ctx, app, func(a *appv1.App) (bool, error) {
		if a == nil {
			return true, nil
		}
		_, there := volumeStatus(a, name)
		return a.Status.ObservedGeneration >= gen && !there, nil
	})
}

// volumeForData checks that u may use app and that it has volume name, for a
// backup or a restore (op). Where the store does not pause the app (a
// cluster), a running app's copy is refused unless live, and notice is told
// when a live copy goes ahead: by default a backup is a still copy, as on one
// machine, and a copy that can miss writes in flight is asked for by name.
func (b *Backend) volumeForData(ctx context.Context, u *User, app, name, op string, live bool, notice func(string)) error {
	a, err := b.app(ctx, u, app)
	if err != nil {
		return err
	}
	if _, ok := findVolume(a, name); !ok {
		return noSuchVolume(a, name)
	}
	if b.cfg.Volumes == nil {
		return Errorf(Invalid, "this server cannot reach the files of %s's volumes: on a cluster the gitserver needs --volume-helper-image (bex's own image, which infra/bex sets); on one machine, containerd (bex up)", app)
	}
	if _, _, err := b.cfg.Volumes.Usage(ctx, app, name); errors.Is(err, fs.ErrNotExist) {
		return Errorf(Conflict, "the volume %s of %s is not made yet: it is made at the app's next deploy", name, app)
	}
	if b.cfg.Volumes.Pauses() || a.Spec.Suspended || a.Spec.Image == "" {
		return nil
	}
	if !live {
		if op == "volumes:backup" {
			return Errorf(Conflict, "%s is running, and on a cluster nothing pauses it for the copy: `suspend %s` first for a still copy (its volumes stay; `resume %s` after), or %s %s %s --live to copy it while it runs (writes in flight can be missed)", app, app, app, op, app, name)
		}
		return Errorf(Conflict, "%s is running, and on a cluster nothing pauses it while its volume is replaced: `suspend %s` first (its volumes stay; `resume %s` after), or %s %s %s --live to restore beside it", app, app, app, op, app, name)
	}
	if notice != nil {
		if op == "volumes:backup" {
			notice(fmt.Sprintf("%s is running: this copy can miss writes in flight (--live)", app))
		} else {
			notice(fmt.Sprintf("%s is running and may write to the volume while it is restored (--live)", app))
		}
	}
	return nil
}

// BackupVolume writes a tar archive of a volume to w. live allows a copy of a
// running app where nothing pauses it (a cluster); notice, when set, gets a
// line for the person when such a copy goes ahead.
func (b *Backend) BackupVolume(ctx context.Context, u *User, app, name string, w io.Writer, live bool, notice func(string)) error {
	if err := b.volumeForData(ctx, u, app, name, "volumes:backup", live, notice); err != nil {
		return err
	}
	b.audit(u, "volumes:backup", app, "volume", name)
	return b.cfg.Volumes.Backup(ctx, app, name, w)
}

// RestoreVolume replaces a volume's contents with the tar archive read from r;
// live and notice as for BackupVolume.
func (b *Backend) RestoreVolume(ctx context.Context, u *User, app, name string, r io.Reader, live bool, notice func(string)) error {
	if err := u.mayChange("volumes:restore"); err != nil {
		return err
	}
	if err := b.volumeForData(ctx, u, app, name, "volumes:restore", live, notice); err != nil {
		return err
	}
	if err := b.cfg.Volumes.Restore(ctx, app, name, r); err != nil {
		return err
	}
	b.audit(u, "volumes:restore", app, "volume", name)
	return nil
}
