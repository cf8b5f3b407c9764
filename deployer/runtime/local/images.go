package local

import (
	"context"
	"errors"
	"fmt"
	"strings"

	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"bex.co/bex/deployer/runtime"
)

var _ runtime.Images = (*Runtime)(nil)

// RemoveImages removes the images of pruned releases from containerd's image
// store in the runtime's namespace (the one BuildKit builds into). An image is
// one or more names pointing at one manifest digest: BuildKit names it
// <repo>:<commit>, and a release names it <repo>@<digest>; every name under repo
// with a removed digest goes, the names of other repositories stay. Each
// delete is synchronous, so containerd's garbage collector has run when it
// returns: content (manifest, config, layers) and the unpacked snapshots that no
// other image, container or lease holds are gone. BuildKit's cache holds the
// layers it made under its own leases; those are its cache's to bound.
func (r *Runtime) RemoveImages(ctx context.Context, repo string, remove, keep []string) ([]string, error) {
	removed, inUse, err := r.removeImages(ctx, repo, remove, keep)
	if len(removed) > 0 {
		r.log.Info("removed the images of pruned releases", "repo", repo, "images", removed)
	}
	return inUse, err
}

// removeImages is RemoveImages, also returning the names it removed.
func (r *Runtime) removeImages(ctx context.Context, repo string, remove, keep []string) (removed, inUse []string, err error) {
	if repo == "" || len(remove) == 0 {
		return nil, nil, nil
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	kept := map[string]bool{}
	for _, ref := range keep {
		if d, ok := repoDigest(repo, ref); ok {
			kept[d] = true
		}
	}
	// The images that containers of the namespace were made from: a running
	// instance (the serving release, the one rolling out, one draining) and a
	// stopped one not yet removed keep theirs, whatever the Releases say.
	ctrs, err := r.cd.ContainerService().List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("listing containers: %w", err)
	}
	usedNames := map[string]bool{}
	for _, c := range ctrs {
		usedNames[c.Image] = true
	}
	all, err := r.cd.ImageService().List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("listing images: %w", err)
	}
	used := map[string]bool{}
	for _, img := range all {
		if usedNames[img.Name] {
			used[img.Target.Digest.String()] = true
		}
	}
	doomed := map[string]bool{}
	for _, ref := range remove {
		d, ok := repoDigest(repo, ref)
		switch {
		case !ok || kept[d]:
		case used[d]:
			inUse = append(inUse, ref)
		default:
			doomed[d] = true
		}
	}
	var victims []cimages.Image
	for _, img := range all {
		if underRepo(repo, img.Name) && doomed[img.Target.Digest.String()] {
			victims = append(victims, img)
		}
	}
	var errs []error
	for _, img := range victims {
		// DeleteTarget: a name a new build moved to another digest since the
		// list is not removed. Synchronous: the collector runs before the
		// delete returns (usually one image per prune).
		err := r.cd.ImageService().Delete(ctx, img.Name, cimages.DeleteTarget(&img.Target), cimages.SynchronousDelete())
		switch {
		case err == nil:
			removed = append(removed, img.Name)
		case errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err):
			// Gone already, or moved to another digest.
		default:
			errs = append(errs, fmt.Errorf("removing image %s: %w", img.Name, err))
		}
	}
	return removed, inUse, errors.Join(errs...)
}

// RemoveRepository removes every image named under repo from containerd's
// namespace, once the app is deleted: the images of its releases and of builds
// that never became one. An image a container of the namespace was made from
// stays (inUse): the caller asks again once the container is gone. refs is not
// needed here: containerd lists every name.
func (r *Runtime) RemoveRepository(ctx context.Context, repo string, _ []string) (bool, error) {
	removed, inUse, err := r.removeRepository(ctx, repo)
	if len(removed) > 0 {
		r.log.Info("removed the images of a deleted app", "repo", repo, "images", removed)
	}
	return inUse, err
}

func (r *Runtime) removeRepository(ctx context.Context, repo string) (removed []string, inUse bool, err error) {
	if repo == "" {
		return nil, false, nil
	}
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	all, err := r.cd.ImageService().List(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("listing images: %w", err)
	}
	var remove []string
	for _, img := range all {
		if underRepo(repo, img.Name) {
			remove = append(remove, repo+"@"+img.Target.Digest.String())
		}
	}
	removed, used, err := r.removeImages(ctx, repo, remove, nil)
	return removed, len(used) > 0, err
}

// repoDigest is the digest of ref when ref is <repo>@<digest>.
func repoDigest(repo, ref string) (string, bool) {
	d, ok := strings.CutPrefix(ref, repo+"@")
	return d, ok && d != ""
}

// underRepo reports whether name is <repo>:<tag> or <repo>@<digest>: exactly
// repo, not a longer repository that begins with it (bex.local/shop-2).
func underRepo(repo, name string) bool {
	rest, ok := strings.CutPrefix(name, repo)
	return ok && len(rest) > 1 && (rest[0] == ':' || rest[0] == '@') && !strings.Contains(rest[1:], "/")
}
