package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"bex.co/bex/builder"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/du"
	"bex.co/bex/internal/machine/daemons"
)

// machineStorage is the backend's Storage on one machine (`bex up`, or a
// gitserver beside a local-runtime deployer): each part is measured by its
// owner — the gitserver's repositories, the builder's logs and BuildKit's
// cache, the local runtime's logs and containerd's images — and the rest of
// the state dir is the platform's.
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
type machineStorage struct {
	stateDir   string
	repos      *pipeline.Pipeline // the apps' repositories: their sizes, compaction and locks
	builder    *builder.Builder
	runtimeDir string // the local runtime's, STATE_DIR/runtime
	namespace  string // the Apps'
	imageRepo  string
	// containerdAddr and containerdNS are the runtime's containerd, where
	// BuildKit builds the images into.
	containerdAddr, containerdNS string
	log                          *slog.Logger

	// measuring runs one Usage at a time: apps:info measures for any member
	// of an app, and each measurement lists containerd's images and BuildKit's
	// records, so a member who calls it from many sessions at once gets them
	// in turn instead of that many measurements running together.
	measuring sync.Mutex
}

var _ backend.Storage = (*machineStorage)(nil)

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
func (m *machineStorage) images(ctx context.Context, apps []backend.StorageApp) (*local.ImageUsage, bool, error) {
	cl, err := daemons.ContainerdClient(m.containerdAddr, m.containerdNS)
	if err != nil {
		return nil, false, fmt.Errorf("containerd at %s: %w", m.containerdAddr, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, measureTimeout)
	defer cancel()
	inside := within(m.stateDir, local.ContentRoot(ctx, cl))
	imgs := &local.Images{Client: cl, Namespace: m.containerdNS, Log: m.log}
	u, err := imgs.Usage(ctx, m.imageRepo, keepOf(apps))
	if err != nil {
		return nil, inside, fmt.Errorf("containerd at %s: %w", m.containerdAddr, err)
	}
	return u, inside, nil
}

// imgsBlobs are the image blobs the lease id holds (none when imgs is nil).
func imgsBlobs(imgs *local.ImageUsage, id string) []local.Blob {
	if imgs == nil {
		return nil
	}
	var out []local.Blob
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

func (m *machineStorage) Usage(ctx context.Context, apps []backend.StorageApp, platform bool) (*backend.DiskUsage, error) {
	m.measuring.Lock()
	defer m.measuring.Unlock()
	out := &backend.DiskUsage{StateDir: m.stateDir, Measured: time.Now().UTC()}
	rows := map[string]*backend.AppUsage{}
	var inState int64 // what the owners measured inside the state dir
	srv := m.repos
	var errs []error
	for _, a := range apps {
		r := &backend.AppUsage{App: a.Name}
		rows[a.Name] = r
		var err error
		if r.Kinds.Repository, err = srv.RepositoryBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.BuildLogs, err = m.builder.LogBytes(a.Name); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.Logs, err = local.LogBytes(m.runtimeDir, types.NamespacedName{Namespace: m.namespace, Name: a.Name}); err != nil {
			errs = append(errs, err)
		}
		if r.Kinds.Volumes, err = local.VolumeBytes(m.runtimeDir, types.NamespacedName{Namespace: m.namespace, Name: a.Name}); err != nil {
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
	recs, err := m.builder.CacheUsage(cctx)
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
		if out.StateDirBytes, err = du.Bytes(m.stateDir); err != nil {
			return nil, fmt.Errorf("measuring %s: %w", m.stateDir, err)
		}
		plat.Kinds.Other = max(out.StateDirBytes-inState, 0)
		free, total, err := pipeline.Statfs(m.stateDir)
		if err != nil {
			out.NotMeasured = append(out.NotMeasured, "the file system: "+err.Error())
		}
		out.FileSystem = backend.FileSystem{Size: int64(total), Free: int64(free)}
		if !inside && daemonsBytes > 0 {
			out.NotMeasured = append(out.NotMeasured, fmt.Sprintf("containerd at %s keeps its root outside %s: its images and build cache are added beside the state dir, and its other files are not counted", m.containerdAddr, m.stateDir))
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

func (m *machineStorage) Prune(ctx context.Context, apps []backend.StorageApp, dryRun bool) (*backend.PruneReport, error) {
	rep := &backend.PruneReport{DryRun: dryRun}
	var errs []error
	// The images first: the build cache's records of their layers are Shared
	// while an image holds them, and prunable once it is gone.
	var u *local.ImageUsage
	var imgs *local.Images
	cl, err := daemons.ContainerdClient(m.containerdAddr, m.containerdNS)
	if err != nil {
		cl = nil
		errs = append(errs, fmt.Errorf("containerd at %s: %w", m.containerdAddr, err))
	} else {
		imgs = &local.Images{Client: cl, Namespace: m.containerdNS, Log: m.log}
		keep := keepOf(apps)
		u, err = imgs.Usage(ctx, m.imageRepo, keep)
		if err != nil {
			errs = append(errs, err)
		}
		srv := m.repos
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
					gone, err = imgs.Remove(ctx, m.imageRepo, a.Name, gone, keep[a.Name])
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
				rep.Items = append(rep.Items, backend.PruneItem{App: a.Name, Kind: "images", What: m.imageRepo + "/" + a.Name + "@" + ri.Digest + " (" + strings.Join(ri.Names, ", ") + ")", Bytes: n})
			}
		}
	}
	var recs []builder.CacheRecord
	if dryRun {
		// What BuildKit would prune now, and the records of the reclaimable
		// images' layers, which it prunes once those images are gone (their
		// own snapshots: the blobs are counted with the images).
		all, err := m.builder.CacheUsage(ctx)
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
		pruned, err := m.builder.PruneCache(ctx, false)
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
	if cl != nil {
		cl.Close()
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
	srv := m.repos
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
