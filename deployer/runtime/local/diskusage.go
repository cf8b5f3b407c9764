package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"k8s.io/apimachinery/pkg/types"

	"bex.co/bex/internal/diskuse"
	"bex.co/bex/internal/du"
	"bex.co/bex/internal/machine/daemons"
)

// LogBytes is the size on disk of app's instances' logs in the runtime's state
// dir (stateDir is the runtime's, STATE_DIR/runtime).
func LogBytes(stateDir string, key types.NamespacedName) (int64, error) {
	r := &Runtime{cfg: Config{StateDir: stateDir}}
	return du.Bytes(r.logDir(key))
}

// Disk is the local runtime's part of one machine's disk as the gitserver's
// system:df measures it, in a process that runs no Runtime: the logs and the
// volumes of the apps of Namespace, under StateDir (the runtime's,
// STATE_DIR/runtime).
type Disk struct {
	StateDir  string
	Namespace string
}

// LogBytes is the size on disk of app's instances' logs.
func (d Disk) LogBytes(app string) (int64, error) {
	return LogBytes(d.StateDir, types.NamespacedName{Namespace: d.Namespace, Name: app})
}

// VolumeBytes is the bytes app's volumes take (VolumeBytes).
func (d Disk) VolumeBytes(app string) (int64, error) {
	return VolumeBytes(d.StateDir, types.NamespacedName{Namespace: d.Namespace, Name: app})
}

// OpenImages reaches the images of containerd at address (a socket's path)
// in its namespace, for system:df and system:prune; Close lets containerd go.
func OpenImages(address, namespace string, log *slog.Logger) (*Images, error) {
	// A socket that is not there cannot answer: say so at once, rather than
	// each call waiting out the client's timeout (apps:info measures the
	// app's disk through this on every call).
	if path := strings.TrimPrefix(address, "unix://"); strings.HasPrefix(path, "/") {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("containerd is not running: no socket at %s", path)
		}
	}
	cl, err := daemons.ContainerdClient(address, namespace)
	if err != nil {
		return nil, err
	}
	return &Images{Client: cl, Namespace: namespace, Log: log}, nil
}

// Close closes the client.
func (m *Images) Close() error { return m.Client.Close() }

// Images measures and prunes the images bex built, in containerd's namespace
// of the runtime, for a process that runs no Runtime (the gitserver's
// system:df and system:prune). It follows RemoveImages' rules: only the names
// <repo>/<app>:… and <repo>/<app>@… of the apps it is given, never while a
// container uses the image or a Release keeps it.
type Images struct {
	Client    *containerd.Client
	Namespace string
	// Snapshotter holds the unpacked images ("": overlayfs, as the runtime's).
	Snapshotter string
	// Log receives what Remove removes and keeps; nil: slog.Default().
	Log *slog.Logger
}

// The images' usage, in the vocabulary system:df joins the disk's owners in.
type (
	ImageBytes       = diskuse.ImageBytes
	ImageUsage       = diskuse.ImageUsage
	Blob             = diskuse.Blob
	ReclaimableImage = diskuse.ReclaimableImage
)

// Usage measures the namespace's images; keep holds, for each app to
// attribute, the image references ("<repo>/<app>@sha256:…") its Releases keep.
// Bytes are containerd's own figures: the blobs' sizes and the snapshotter's
// usage of each unpacked layer. Content that BuildKit's cache also holds
// under its leases is counted here, as an image's, and freed only once
// BuildKit's record goes too (system:prune prunes both).
func (m *Images) Usage(ctx context.Context, repo string, keep map[string][]string) (*ImageUsage, error) {
	ctx = namespaces.WithNamespace(ctx, m.Namespace)
	ctrs, err := m.Client.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	usedNames := map[string]bool{}
	for _, c := range ctrs {
		usedNames[c.Image] = true
	}
	all, err := m.Client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	used := map[string]bool{}
	for _, img := range all {
		if usedNames[img.Name] {
			used[img.Target.Digest.String()] = true
		}
	}
	// One holder per (owner, digest): the names of one image hold the same.
	type holder struct{ app, digest string }
	holders := map[holder][]cimages.Image{}
	for _, img := range all {
		h := holder{digest: img.Target.Digest.String()}
		for app := range keep {
			if underRepo(repo+"/"+app, img.Name) {
				h.app = app
			}
		}
		holders[h] = append(holders[h], img)
	}
	doomed := map[holder]bool{}
	for h := range holders {
		if h.app == "" || used[h.digest] {
			continue
		}
		kept := false
		for _, ref := range keep[h.app] {
			if d, ok := repoDigest(repo+"/"+h.app, ref); ok && d == h.digest {
				kept = true
			}
		}
		doomed[h] = !kept
	}

	// The blobs and snapshots each holder holds.
	type resource struct {
		size    int64
		holders map[holder]bool
	}
	res := map[string]*resource{}
	add := func(key string, size int64, h holder) {
		r := res[key]
		if r == nil {
			r = &resource{size: size, holders: map[holder]bool{}}
			res[key] = r
		}
		r.holders[h] = true
	}
	cs := m.Client.ContentStore()
	sn := m.Client.SnapshotService(m.snapshotter())
	for h, imgs := range holders {
		img := imgs[0]
		err := cimages.Walk(ctx, cimages.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			info, err := cs.Info(ctx, desc.Digest)
			if errdefs.IsNotFound(err) {
				return nil, nil // not fetched (another platform's)
			}
			if err != nil {
				return nil, err
			}
			add("blob:"+desc.Digest.String(), info.Size, h)
			return cimages.Children(ctx, cs, desc)
		}), img.Target)
		if err != nil {
			return nil, fmt.Errorf("reading image %s: %w", img.Name, err)
		}
		diffIDs, err := containerd.NewImage(m.Client, img).RootFS(ctx)
		if err != nil {
			continue // not an image of this platform: no snapshots
		}
		for _, chain := range identity.ChainIDs(diffIDs) {
			u, err := sn.Usage(ctx, chain.String())
			if err != nil {
				continue // not unpacked
			}
			add("snapshot:"+chain.String(), u.Size, h)
		}
	}

	out := &ImageUsage{Apps: map[string]ImageBytes{}, Reclaimable: map[string][]ReclaimableImage{}}
	for app := range keep {
		out.Apps[app] = ImageBytes{}
	}
	leased, leaseBlobs, err := m.leased(ctx)
	if err != nil {
		return nil, err
	}
	out.Blobs, out.LeaseBlobs = map[string]Blob{}, leaseBlobs
	alone, aloneFree := map[holder]int64{}, map[holder]int64{}
	for key, r := range res {
		owners := map[string]bool{}
		allDoomed := true
		for h := range r.holders {
			owners[h.app] = true
			allDoomed = allDoomed && doomed[h]
		}
		row := &out.Shared
		var app string
		if len(owners) == 1 {
			for a := range owners {
				app = a
			}
		}
		var ib ImageBytes
		if app != "" {
			ib = out.Apps[app]
			row = &ib
		}
		row.Bytes += r.size
		if allDoomed {
			row.Reclaimable += r.size
			if len(r.holders) == 1 {
				for h := range r.holders {
					alone[h] += r.size
					if !leased[key] {
						aloneFree[h] += r.size
					}
				}
			}
		}
		if app != "" {
			out.Apps[app] = ib
		}
		if d, ok := strings.CutPrefix(key, "blob:"); ok {
			out.Blobs[d] = Blob{Size: r.size, App: app, Reclaimable: allDoomed}
		}
	}
	for h, imgs := range holders {
		if !doomed[h] {
			continue
		}
		ri := ReclaimableImage{Digest: h.digest, Bytes: alone[h], Freed: aloneFree[h]}
		for _, img := range imgs {
			ri.Names = append(ri.Names, img.Name)
		}
		sort.Strings(ri.Names)
		out.Reclaimable[h.app] = append(out.Reclaimable[h.app], ri)
	}
	for _, list := range out.Reclaimable {
		sort.Slice(list, func(i, j int) bool { return list[i].Names[0] < list[j].Names[0] })
	}
	return out, nil
}

// Remove removes app's images that Usage found reclaimable (list), through
// RemoveImages' checks: a container that began to use one meanwhile keeps it,
// and so does a reference in keep. It returns those removed. The caller keeps
// new images from appearing meanwhile (the gitserver holds the app's push lock:
// a push's image is built, released and rolled out under it).
func (m *Images) Remove(ctx context.Context, repo, app string, list []ReclaimableImage, keep []string) ([]ReclaimableImage, error) {
	log := m.Log
	if log == nil {
		log = slog.Default()
	}
	r := &Runtime{cd: m.Client, cfg: Config{Namespace: m.Namespace}, log: log}
	appRepo := repo + "/" + app
	var remove []string
	for _, ri := range list {
		remove = append(remove, appRepo+"@"+ri.Digest)
	}
	removed, _, err := r.removeImages(ctx, appRepo, remove, keep)
	if len(removed) > 0 {
		log.Info("removed the images no release keeps", "repo", appRepo, "images", removed)
	}
	gone := map[string]bool{}
	for _, n := range removed {
		gone[n] = true
	}
	var out []ReclaimableImage
	for _, ri := range list {
		for _, n := range ri.Names {
			if gone[n] {
				out = append(out, ri)
				break
			}
		}
	}
	return out, err
}

// leased are the blobs and snapshots ("blob:<digest>", "snapshot:<key>") that
// a lease of the namespace holds, and each lease's blobs: BuildKit's cache
// records hold theirs so, under leases named by the records' ids.
func (m *Images) leased(ctx context.Context) (map[string]bool, map[string][]string, error) {
	ls := m.Client.LeasesService()
	list, err := ls.List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("listing leases: %w", err)
	}
	out, blobs := map[string]bool{}, map[string][]string{}
	for _, l := range list {
		rs, err := ls.ListResources(ctx, l)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue
			}
			return nil, nil, fmt.Errorf("listing the resources of lease %s: %w", l.ID, err)
		}
		for _, r := range rs {
			switch {
			case r.Type == "content":
				out["blob:"+r.ID] = true
				blobs[l.ID] = append(blobs[l.ID], r.ID)
			case r.Type == "snapshots/"+m.snapshotter():
				out["snapshot:"+r.ID] = true
			}
		}
	}
	return out, blobs, nil
}

func (m *Images) snapshotter() string {
	if m.Snapshotter == "" {
		return "overlayfs"
	}
	return m.Snapshotter
}

// ContentRoot is where containerd keeps its content and
// snapshots, as its introspection service says ("" when it does not say).
func (m *Images) ContentRoot(ctx context.Context) string {
	resp, err := m.Client.IntrospectionService().Plugins(ctx, "type==io.containerd.content.v1")
	if err != nil {
		return ""
	}
	for _, p := range resp.Plugins {
		if root := p.Exports["root"]; root != "" {
			return filepath.Dir(root)
		}
	}
	return ""
}

// CollectGarbage runs containerd's garbage collection now and returns when it
// has run. Removing an image collects at once (a synchronous delete), but
// BuildKit's prune only deletes the leases that held its records' blobs and
// snapshots: containerd collects them on its own schedule, seconds later, so
// system:prune would return before the disk has its bytes back. Deleting a
// lease synchronously is the one request that makes containerd collect before
// it answers; the lease made for it holds nothing.
func (im *Images) CollectGarbage(ctx context.Context) error {
	ctx = namespaces.WithNamespace(ctx, im.Namespace)
	ls := im.Client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		return fmt.Errorf("containerd's garbage collection: %w", err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		return fmt.Errorf("containerd's garbage collection: %w", err)
	}
	return nil
}
