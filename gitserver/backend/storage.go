package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Storage measures the disk of one machine's state dir and frees what is
// reclaimable (system:df, system:prune, apps:info's bytes). gitserver/storage's
// Machine implements it from the parts' owners (the gitserver's repositories,
// the builder's logs and BuildKit's cache, the local runtime's logs, volumes
// and containerd's images), and cmd/bex wires it on the local runtime; without
// it (a cluster) those commands say so.
type Storage interface {
	// Usage measures the apps' bytes and, with platform, the platform's and the
	// file system's. Each app's Keep are the images its Releases and spec name:
	// those are not reclaimable. A part that could not be measured is 0 and
	// named in DiskUsage.NotMeasured, never left out silently.
	Usage(ctx context.Context, apps []StorageApp, platform bool) (*DiskUsage, error)
	// Prune removes what is reclaimable now (the images no Release keeps and no
	// container uses, BuildKit's records not in use, the repositories'
	// unreachable objects); with dryRun it only lists it.
	Prune(ctx context.Context, apps []StorageApp, dryRun bool) (*PruneReport, error)
}

// StorageApp is one app as Storage measures it.
type StorageApp struct {
	Name string
	// Keep are the image references ("<repo>/<app>@sha256:...") of the app's
	// Releases and spec: kept whatever else holds them.
	Keep []string
}

// Bytes are the bytes of one row of system:df, by kind.
type Bytes struct {
	// Images: containerd's content (manifests, configs, layers) and unpacked
	// snapshots of the images bex built for the app; on the platform's row,
	// those two or more apps' images share, and the other images (base images).
	Images int64 `json:"images"`
	// BuildCache: BuildKit's cache records: an app's when the record names it,
	// or when its layer's blob is one of the app's images' (the blob then
	// counted as images, the record's own snapshot here).
	BuildCache int64 `json:"buildCache"`
	// BuildLogs are the builder's stored logs of the app's builds.
	BuildLogs int64 `json:"buildLogs"`
	// Logs are the app's instances' runtime logs.
	Logs int64 `json:"logs"`
	// Repository is the app's bare git repository.
	Repository int64 `json:"repository"`
	// Volumes are the app's volumes: their images' full size, taken from the
	// disk when each was made (never reclaimable: volumes:destroy frees them).
	Volumes int64 `json:"volumes"`
	// Other, on the platform's row, is the rest of the state dir: etcd,
	// containerd's and buildkitd's own files, bex's logs and binaries.
	Other int64 `json:"other"`
}

// Sum is the row's bytes.
func (b Bytes) Sum() int64 {
	return b.Images + b.BuildCache + b.BuildLogs + b.Logs + b.Repository + b.Volumes + b.Other
}

// AppUsage is one app's bytes on disk.
type AppUsage struct {
	App string `json:"app"`
	// Bytes is the sum of Kinds.
	Bytes int64 `json:"bytes"`
	Kinds Bytes `json:"kinds"`
	// Reclaimable is what system:prune would free of it now, by kind in
	// ReclaimableKinds.
	Reclaimable      int64 `json:"reclaimable"`
	ReclaimableKinds Bytes `json:"reclaimableKinds"`
}

// DiskUsage is system:df: the apps' rows and the platform's, which add up to
// the state dir's bytes (each byte counted once), and the file system's room.
type DiskUsage struct {
	StateDir string `json:"stateDir"`
	// Bytes is the sum of the rows: the state dir's bytes on disk, plus the
	// daemons' (containerd's) bytes when they are kept outside it.
	Bytes       int64 `json:"bytes"`
	Reclaimable int64 `json:"reclaimable"`
	// StateDirBytes is the state dir measured as `du -sbx` does.
	StateDirBytes int64      `json:"stateDirBytes"`
	Apps          []AppUsage `json:"apps"`
	Platform      AppUsage   `json:"platform"`
	// BuildCacheShared is the size BuildKit gives its records whose layers an
	// image holds but whose blobs could not be found (no lease names them):
	// their blobs are counted as images, their own snapshots in the
	// platform's other; shown for what it is, in no row, so that nothing is
	// counted twice.
	BuildCacheShared int64 `json:"buildCacheShared"`
	// FileSystem is the state dir's file system: its size and what is free.
	FileSystem FileSystem `json:"fileSystem"`
	// NotMeasured names each part that could not be measured and why; its
	// bytes are 0 above.
	NotMeasured []string  `json:"notMeasured"`
	Measured    time.Time `json:"measured"`
}

// FileSystem is the size and the free bytes of a file system.
type FileSystem struct {
	Size int64 `json:"size"`
	Free int64 `json:"free"`
}

// PruneItem is one thing system:prune removes (or, dry, would remove).
type PruneItem struct {
	// App is the app it is of, or "" for the platform.
	App string `json:"app,omitempty"`
	// Kind is images, buildCache or repository.
	Kind string `json:"kind"`
	// What names it: an image, a cache record, a repository.
	What string `json:"what"`
	// Bytes it frees (for a repository, known only once git gc ran: 0 dry).
	Bytes int64 `json:"bytes"`
}

// PruneReport is what system:prune removed, or would.
type PruneReport struct {
	DryRun bool        `json:"dryRun"`
	Items  []PruneItem `json:"items"`
	// Bytes is the sum of the items' bytes.
	Bytes int64 `json:"bytes"`
	// Skipped says what was left and why (a push holds an app's repository).
	Skipped []string `json:"skipped"`
}

// noStorage is the one refusal of a backend without Storage.
func noStorage(what string) error {
	return Errorf(Invalid, "%s measures the state dir of one machine (bex up); this server has none wired: on a cluster, read the nodes' and the registry's disk with their own tools", what)
}

// storageApps are the apps given with the images their Releases and spec keep.
func (b *Backend) storageApps(ctx context.Context, names []string) ([]StorageApp, error) {
	out := make([]StorageApp, 0, len(names))
	for _, name := range names {
		rels, err := b.cfg.Releases.List(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("listing the releases of %s: %w", name, err)
		}
		sa := StorageApp{Name: name}
		for _, r := range rels {
			if r.Spec.Image != "" {
				sa.Keep = append(sa.Keep, r.Spec.Image)
			}
		}
		out = append(out, sa)
	}
	return out, nil
}

// allStorageApps are every app, for an admin.
func (b *Backend) allStorageApps(ctx context.Context, u *User) ([]StorageApp, error) {
	apps, err := b.apps(ctx, u)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(apps))
	keep := map[string]string{}
	for _, a := range apps {
		names = append(names, a.Name)
		keep[a.Name] = a.Spec.Image
	}
	sas, err := b.storageApps(ctx, names)
	if err != nil {
		return nil, err
	}
	for i := range sas {
		if img := keep[sas[i].Name]; img != "" {
			sas[i].Keep = append(sas[i].Keep, img)
		}
	}
	return sas, nil
}

// DiskUsage is system:df: every app's bytes and the platform's. Admins only:
// it names every app and the machine's free space.
func (b *Backend) DiskUsage(ctx context.Context, u *User) (*DiskUsage, error) {
	if err := requireAdmin(u, "system:df"); err != nil {
		return nil, err
	}
	if b.cfg.Storage == nil {
		return nil, noStorage("system:df")
	}
	apps, err := b.allStorageApps(ctx, u)
	if err != nil {
		return nil, err
	}
	du, err := b.cfg.Storage.Usage(ctx, apps, true)
	if err != nil {
		return nil, fmt.Errorf("measuring the disk: %w", err)
	}
	du.Apps, du.NotMeasured = nonNil(du.Apps), nonNil(du.NotMeasured)
	return du, nil
}

// Prune is system:prune: it removes what is reclaimable now (dryRun: lists
// it). Admins only; the audit line says what went and how many bytes.
func (b *Backend) Prune(ctx context.Context, u *User, dryRun bool) (*PruneReport, error) {
	if !dryRun {
		if err := u.mayChange("system:prune"); err != nil {
			return nil, err
		}
	}
	if err := requireAdmin(u, "system:prune"); err != nil {
		return nil, err
	}
	if b.cfg.Storage == nil {
		return nil, noStorage("system:prune")
	}
	apps, err := b.allStorageApps(ctx, u)
	if err != nil {
		return nil, err
	}
	rep, err := b.cfg.Storage.Prune(ctx, apps, dryRun)
	if rep != nil {
		rep.Items, rep.Skipped = nonNil(rep.Items), nonNil(rep.Skipped)
		if !dryRun {
			b.audit(u, "system:prune", "", "items", len(rep.Items), "bytes", rep.Bytes, "skipped", len(rep.Skipped))
		}
	}
	if err != nil {
		return rep, fmt.Errorf("pruning: %w", err)
	}
	return rep, nil
}

// appUsage is one app's bytes for apps:info, which anyone who may use the app
// sees: nil when there is no Storage or it failed (apps:info still answers;
// the failure is logged).
func (b *Backend) appUsage(ctx context.Context, name, specImage string) *AppUsage {
	if b.cfg.Storage == nil {
		return nil
	}
	sas, err := b.storageApps(ctx, []string{name})
	if err != nil {
		b.log.Warn("measuring an app's disk", "app", name, "err", err)
		return nil
	}
	if specImage != "" {
		sas[0].Keep = append(sas[0].Keep, specImage)
	}
	du, err := b.cfg.Storage.Usage(ctx, sas, false)
	if err != nil {
		b.log.Warn("measuring an app's disk", "app", name, "err", err)
		return nil
	}
	for _, a := range du.Apps {
		if a.App == name {
			return &a
		}
	}
	return nil
}

// errDiskNotMeasured is DiskPressure's answer without Config.DiskCheck.
var errDiskNotMeasured = errors.New("not measured: this server has no disk check wired")

// DiskPressure is nil when the server's disk has room for pushes and
// deploys, else the one line that says what is short (what pushes are told).
func (b *Backend) DiskPressure() error {
	if b.cfg.DiskCheck == nil {
		return errDiskNotMeasured
	}
	return b.cfg.DiskCheck()
}
