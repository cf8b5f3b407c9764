package builder

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	bkclient "github.com/moby/buildkit/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/diskuse"
	"bex.co/bex/internal/du"
)

// LogBytes is the size on disk of app's stored build logs and records.
func (b *Builder) LogBytes(app string) (int64, error) {
	if !appv1.ValidAppName(app) {
		return 0, fmt.Errorf("%w: app %q", ErrInvalidName, app)
	}
	return du.Bytes(filepath.Join(b.cfg.LogDir, app))
}

// CacheRecord is one record of BuildKit's cache, as its DiskUsage reports it
// (in the vocabulary system:df joins the disk's owners in).
type CacheRecord = diskuse.CacheRecord

// CacheUsage lists BuildKit's cache records (DiskUsage).
func (b *Builder) CacheUsage(ctx context.Context) ([]CacheRecord, error) {
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	recs, err := c.DiskUsage(ctx)
	if err != nil {
		return nil, fmt.Errorf("buildkitd's disk usage: %w", err)
	}
	out := make([]CacheRecord, 0, len(recs))
	for _, r := range recs {
		out = append(out, b.record(r))
	}
	return out, nil
}

// PruneCache removes BuildKit's records that are reclaimable now (Prune
// without the GC policy's bounds: everything not in use, as `buildctl prune`)
// and returns them; dryRun only lists them.
func (b *Builder) PruneCache(ctx context.Context, dryRun bool) ([]CacheRecord, error) {
	if dryRun {
		all, err := b.CacheUsage(ctx)
		if err != nil {
			return nil, err
		}
		var out []CacheRecord
		for _, r := range all {
			if r.Reclaimable {
				out = append(out, r)
			}
		}
		return out, nil
	}
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ch := make(chan bkclient.UsageInfo)
	done := make(chan []CacheRecord)
	go func() {
		var out []CacheRecord
		for r := range ch {
			out = append(out, b.record(&r))
		}
		done <- out
	}()
	err = c.Prune(ctx, ch)
	close(ch)
	out := <-done
	if err != nil {
		return out, fmt.Errorf("pruning buildkitd's cache: %w", err)
	}
	return out, nil
}

func (b *Builder) record(r *bkclient.UsageInfo) CacheRecord {
	internal := r.RecordType == bkclient.UsageRecordTypeInternal || r.RecordType == bkclient.UsageRecordTypeFrontend
	return CacheRecord{ID: r.ID, Description: r.Description, Size: r.Size, InUse: r.InUse, Shared: r.Shared,
		Reclaimable: !r.InUse && !r.Shared && !internal, App: b.appOfRecord(r.Description)}
}

// appOfRecord is the app a cache record's description names: an image of
// the app (<ImageRepo>/<app>:… or @…) or a cache mount whose id begins
// with <ImageRepo>/<app>/ (bex namespaces every build's cache mounts as
// <ImageRepo>/<app>/<uid>/: "with id \"bex.local/shop/<uid>//root/.cache\"").
// Other records (layers, the build context, base images) name no app and are the
// platform's. The cache mounts of a destroyed app whose name was taken again are
// counted as the new app's until they are pruned.
func (b *Builder) appOfRecord(desc string) string {
	prefix := b.cfg.ImageRepo + "/"
	for rest, at := desc, 0; ; {
		i := strings.Index(rest[at:], prefix)
		if i < 0 {
			return ""
		}
		i += at
		at = i + len(prefix)
		// The repository begins a word: not a path inside another name.
		if i > 0 && !strings.ContainsRune(" \"'=", rune(rest[i-1])) {
			continue
		}
		name := rest[at:]
		end := strings.IndexAny(name, ":@/\"' ")
		if end > 0 && appv1.ValidAppName(name[:end]) {
			return name[:end]
		}
	}
}
