package storage

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/diskuse"
	"bex.co/bex/internal/du"
)

// Builds is the builder's disk: its stored build logs and BuildKit's cache.
type Builds interface {
	// LogBytes is the size of app's stored build logs.
	LogBytes(app string) (int64, error)
	// CacheUsage lists BuildKit's cache records.
	CacheUsage(ctx context.Context) ([]diskuse.CacheRecord, error)
	// PruneCache prunes what BuildKit's prune removes now (dryRun: lists
	// it) and returns the records it removed.
	PruneCache(ctx context.Context, dryRun bool) ([]diskuse.CacheRecord, error)
}

// RuntimeDisk is the runtime's disk of each app in the state dir.
type RuntimeDisk interface {
	// LogBytes is the size of app's instances' logs.
	LogBytes(app string) (int64, error)
	// VolumeBytes is the size of app's volumes.
	VolumeBytes(app string) (int64, error)
}

// ImageStore is the images on this machine (containerd's), opened for one
// measurement or prune.
type ImageStore interface {
	// Usage measures the images named <repo>/<app> of the apps of keep, with
	// the image references each app's Releases keep.
	Usage(ctx context.Context, repo string, keep map[string][]string) (*diskuse.ImageUsage, error)
	// Remove removes the reclaimable images list of app, but those of keep,
	// and returns those it removed.
	Remove(ctx context.Context, repo, app string, list []diskuse.ReclaimableImage, keep []string) ([]diskuse.ReclaimableImage, error)
	// CollectGarbage frees now what no image or lease holds.
	CollectGarbage(ctx context.Context) error
	// ContentRoot is where the store keeps its content ("" unknown).
	ContentRoot(ctx context.Context) string
	Close() error
}

// Machine is the backend's Storage on one machine (`bex up`, or a gitserver
// beside a local-runtime deployer): each part is measured by its owner — the
// gitserver's repositories, the builder's logs and BuildKit's cache, the local
// runtime's logs and containerd's images — and the rest of the state dir is
// the platform's.
//
// Each byte is counted once: the state dir is walked once (du -sbx, hard links
// once) for its total, and the platform's "other" is that total less the parts
// the owners measured inside it; a blob or snapshot two apps' images share, or
// that a base image holds, is the platform's images, not either app's;
// BuildKit's Shared records (whose layer blob an image holds) count their own
// snapshot only, as the build cache of the app the blob is counted for (the
// blob found through the record's lease); containerd's and
// buildkitd's bytes count in the state dir's total only when containerd keeps
// its root inside it (bex up), else they are added beside it.
type Machine struct {
	StateDir string
	Repos    *pipeline.Pipeline // the apps' repositories: their sizes, compaction and locks
	Builds   Builds
	Runtime  RuntimeDisk
	// OpenImages reaches containerd's images, where BuildKit builds the images
	// into; ImagesAt names it in messages (containerd's address).
	OpenImages func() (ImageStore, error)
	ImagesAt   string
	ImageRepo  string

	// measuring runs one Usage at a time: apps:info measures for any member
	// of an app, and each measurement lists containerd's images and BuildKit's
	// records, so a member who calls it from many sessions at once gets them
	// in turn instead of that many measurements running together.
	measuring sync.Mutex
}

var _ backend.Storage = (*Machine)(nil)

// measureTimeout bounds each daemon's answer, so that a stuck containerd or
// buildkitd makes its part "not measured" rather than system:df hang.
const measureTimeout = 30 * time.Second

func keepOf(apps []backend.StorageApp) map[string][]string {
	keep := map[string][]string{}
	for _, a := range apps {
		keep[a.Name] = append([]string(nil), a.Keep...)
	}
	return keep
}

// images measures containerd's images, and says whether containerd keeps its
// root inside the state dir.
func (m *Machine) images(ctx context.Context, apps []backend.StorageApp) (*diskuse.ImageUsage, bool, error) {
	imgs, err := m.OpenImages()
	if err != nil {
		return nil, false, fmt.Errorf("containerd at %s: %w", m.ImagesAt, err)
	}
	defer imgs.Close()
	ctx, cancel := context.WithTimeout(ctx, measureTimeout)
	defer cancel()
	inside := within(m.StateDir, imgs.ContentRoot(ctx))
	u, err := imgs.Usage(ctx, m.ImageRepo, keepOf(apps))
	if err != nil {
		return nil, inside, fmt.Errorf("containerd at %s: %w", m.ImagesAt, err)
	}
	return u, inside, nil
}

// imgsBlobs are the image blobs the lease id holds (none when imgs is nil).
func imgsBlobs(imgs *diskuse.ImageUsage, id string) []diskuse.Blob {
	if imgs == nil {
		return nil
	}
	var out []diskuse.Blob
	for _, d := range imgs.LeaseBlobs[id] {
		if b, ok := imgs.Blobs[d]; ok {
			out = append(out, b)
		}
	}
	return out
}

// within reports whether path is dir or below it.
func within(dir, path string) bool {
	if path == "" {
		return false
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
func (m *Machine) Usage(ctx context.Context, apps []backend.StorageApp, platform bool) (*backend.DiskUsage, error) {
	m.measuring.Lock()
	defer m.measuring.Unlock()
	out := &backend.DiskUsage{StateDir: m.StateDir, Measured: time.Now().UTC()}
	rows := map[string]*backend.AppUsage{}
	var inState int64 // what the owners measured inside the state dir
	srv := m.Repos
	var errs []error
	for _, a := range apps {
		r := &backend.AppUsage{App: a.Name}
		rows[a.Name] = r
		var err error
		if r.Kinds.Repository, err = srv.RepositoryBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.BuildLogs, err = m.Builds.LogBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.Logs, err = m.Runtime.LogBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.Volumes, err = m.Runtime.VolumeBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		inState += r.Kinds.Repository + r.Kinds.BuildLogs + r.Kinds.Logs + r.Kinds.Volumes
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	plat := &backend.AppUsage{}

	imgs, inside, err := m.images(ctx, apps)
	if err != nil {
		out.NotMeasured = append(out.NotMeasured, "images: "+err.Error())
	} else {
		for app, ib := range imgs.Apps {
			if r := rows[app]; r != nil {
				r.Kinds.Images, r.ReclaimableKinds.Images = ib.Bytes, ib.Reclaimable
			}
		}
		plat.Kinds.Images, plat.ReclaimableKinds.Images = imgs.Shared.Bytes, imgs.Shared.Reclaimable
	}

	cctx, cancel := context.WithTimeout(ctx, measureTimeout)
	recs, err := m.Builds.CacheUsage(cctx)
	cancel()
	if err != nil {
		out.NotMeasured = append(out.NotMeasured, "build cache: "+err.Error())
	}
	for _, rec := range recs {
		size, reclaimable, row := rec.Size, rec.Reclaimable, plat
		if r := rows[rec.App]; r != nil {
			row = r
		}
		if rec.Shared {
			// Its layer blob is an image's, counted there: what is left of
			// its size is its own snapshot, the build cache of whichever app
			// the blob is counted for, reclaimable with the images that hold
			// the blob. The blob is found through the record's lease (named
			// by the record's id); without one, the record is shown apart.
			blobs := imgsBlobs(imgs, rec.ID)
			if len(blobs) == 0 {
				out.BuildCacheShared += rec.Size
				continue
			}
			reclaimable, row = true, plat
			if r := rows[blobs[0].App]; r != nil {
				row = r
			}
			for _, b := range blobs {
				size -= b.Size
				reclaimable = reclaimable && b.Reclaimable
				if b.App != blobs[0].App {
					row = plat
				}
			}
			size = max(size, 0)
		}
		row.Kinds.BuildCache += size
		if reclaimable {
			row.ReclaimableKinds.BuildCache += size
		}
	}

	daemonsBytes := plat.Kinds.Images + plat.Kinds.BuildCache
	for _, r := range rows {
		daemonsBytes += r.Kinds.Images + r.Kinds.BuildCache
	}
	if inside {
		inState += daemonsBytes
	}
	if platform {
		if out.StateDirBytes, err = du.Bytes(m.StateDir); err != nil {
			return nil, fmt.Errorf("measuring %s: %w", m.StateDir, err)
		}
		plat.Kinds.Other = max(out.StateDirBytes-inState, 0)
		free, total, err := pipeline.Statfs(m.StateDir)
		if err != nil {
			out.NotMeasured = append(out.NotMeasured, "the file system: "+err.Error())
		}
		out.FileSystem = backend.FileSystem{Size: int64(total), Free: int64(free)}
		if !inside && daemonsBytes > 0 {
			out.NotMeasured = append(out.NotMeasured, fmt.Sprintf("containerd at %s keeps its root outside %s: its images and build cache are added beside the state dir, and its other files are not counted", m.ImagesAt, m.StateDir))
		}
	}
	for _, a := range apps {
		r := rows[a.Name]
		r.Bytes, r.Reclaimable = r.Kinds.Sum(), r.ReclaimableKinds.Sum()
		out.Apps = append(out.Apps, *r)
		out.Bytes += r.Bytes
		out.Reclaimable += r.Reclaimable
	}
	if platform {
		plat.Bytes, plat.Reclaimable = plat.Kinds.Sum(), plat.ReclaimableKinds.Sum()
		out.Platform = *plat
		out.Bytes += plat.Bytes
		out.Reclaimable += plat.Reclaimable
	}
	return out, nil
}

func (m *Machine) Prune(ctx context.Context, apps []backend.StorageApp, dryRun bool) (*backend.PruneReport, error) {
	rep := &backend.PruneReport{DryRun: dryRun}
	var errs []error
	// The images first: the build cache's records of their layers are Shared
	// while an image holds them, and prunable once it is gone.
	var u *diskuse.ImageUsage
	imgs, err := m.OpenImages()
	if err != nil {
		imgs = nil
		errs = append(errs, fmt.Errorf("containerd at %s: %w", m.ImagesAt, err))
	} else {
		keep := keepOf(apps)
		u, err = imgs.Usage(ctx, m.ImageRepo, keep)
		if err != nil {
			errs = append(errs, err)
		}
		srv := m.Repos
		for _, a := range apps {
			if u == nil || len(u.Reclaimable[a.Name]) == 0 {
				continue
			}
			gone := u.Reclaimable[a.Name]
			if !dryRun {
				// Under the app's push lock: an image a push has built but not
				// yet released is not taken for one no release keeps.
				err = srv.IfIdle(a.Name, "system:prune", func() error {
					var err error
					gone, err = imgs.Remove(ctx, m.ImageRepo, a.Name, gone, keep[a.Name])
					return err
				})
				switch {
				case errors.Is(err, pipeline.ErrRepositoryBusy):
					rep.Skipped = append(rep.Skipped, fmt.Sprintf("the images of %s: a push or deploy holds the app; run system:prune again once it ends", a.Name))
					continue
				case err != nil:
					errs = append(errs, err)
				}
			}
			for _, ri := range gone {
				// Dry, an image counts what goes with the cache records of its
				// layers, not prunable before it goes; pruned, what its removal
				// freed, those records then counting for themselves.
				n := ri.Bytes
				if !dryRun {
					n = ri.Freed
				}
				rep.Items = append(rep.Items, backend.PruneItem{App: a.Name, Kind: "images", What: m.ImageRepo + "/" + a.Name + "@" + ri.Digest + " (" + strings.Join(ri.Names, ", ") + ")", Bytes: n})
			}
		}
	}
	var recs []diskuse.CacheRecord
	if dryRun {
		// What BuildKit would prune now, and the records of the reclaimable
		// images' layers, which it prunes once those images are gone (their
		// own snapshots: the blobs are counted with the images).
		all, err := m.Builds.CacheUsage(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, rec := range all {
			switch blobs := imgsBlobs(u, rec.ID); {
			case rec.Reclaimable:
				recs = append(recs, rec)
			case rec.Shared && !rec.InUse && len(blobs) > 0:
				gone := true
				for _, b := range blobs {
					rec.Size -= b.Size
					gone = gone && b.Reclaimable
				}
				if gone {
					rec.Size = max(rec.Size, 0)
					rec.Description += " (once the images of its layer go)"
					if rec.App == "" {
						rec.App = blobs[0].App
					}
					recs = append(recs, rec)
				}
			}
		}
	} else {
		pruned, err := m.Builds.PruneCache(ctx, false)
		if err != nil {
			errs = append(errs, err)
		}
		recs = pruned
		// BuildKit's prune lets go of its records' blobs and snapshots;
		// containerd frees them when it next collects: now, so that the disk
		// has its bytes back when system:prune says so.
		if imgs != nil && len(pruned) > 0 {
			if err := imgs.CollectGarbage(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if imgs != nil {
		imgs.Close()
	}
	known := map[string]bool{}
	for _, a := range apps {
		known[a.Name] = true
	}
	for _, rec := range recs {
		app := rec.App
		if !known[app] {
			app = ""
		}
		what := rec.Description
		if what == "" {
			what = rec.ID
		}
		rep.Items = append(rep.Items, backend.PruneItem{App: app, Kind: "buildCache", What: what, Bytes: rec.Size})
	}
	srv := m.Repos
	for _, a := range apps {
		if dryRun {
			if n, _ := srv.RepositoryBytes(a.Name); n > 0 {
				rep.Items = append(rep.Items, backend.PruneItem{App: a.Name, Kind: "repository", What: "git gc --prune=now"})
			}
			continue
		}
		freed, err := srv.CompactRepository(ctx, a.Name)
		switch {
		case errors.Is(err, pipeline.ErrRepositoryBusy):
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("the repository of %s: a push or deploy holds it; run system:prune again once it ends", a.Name))
		case err != nil:
			errs = append(errs, fmt.Errorf("compacting the repository of %s: %w", a.Name, err))
		default:
			if n, _ := srv.RepositoryBytes(a.Name); n > 0 || freed > 0 {
				rep.Items = append(rep.Items, backend.PruneItem{App: a.Name, Kind: "repository", What: "git gc --prune=now", Bytes: freed})
			}
		}
	}
	for _, it := range rep.Items {
		rep.Bytes += it.Bytes
	}
	return rep, errors.Join(errs...)
}
