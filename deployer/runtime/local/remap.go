package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"
)

// An instance runs in a user namespace of its app's id range (security.go), so
// it needs the image's files owned by that range: containerd 1.6 has no
// idmapped mounts, so a chowned copy of the image is made, once per image and
// range, and every container of the app on that image gets a snapshot on top
// of it. containerd's client does the same (WithUserNSRemappedSnapshot), and
// bex used it; withRemappedSnapshot differs in what made pushes slow:
//
//   - The copies of an app's last two images outlive their containers: a
//     lease holds each, renewed at each container made on it. containerd's
//     own copy was held by its containers alone, so it went with the first of
//     them and the next made it again: a release command's one-off and then
//     the release's web instance made it twice (12 s and 19 s for the Node
//     sample's 116 MiB on a busy 2-core machine, of a 47 s push). Not more
//     than two, nor for longer than a day unused: each is a full copy of a
//     base image, which a copy per release kept for rollbacks, or per deploy
//     in the last minutes, would multiply. Deleting the app lets its copies go.
//   - It is made on an overlay mount with `volatile`: a chown copies the file
//     up, and overlayfs syncs every copy-up (tens of thousands of fsyncs for a
//     Debian base) unless told not to; one syncfs of the upper directory's
//     filesystem before the commit makes the copy as durable. The Node
//     stand-in (40,254 files, 436 MiB) took 10.2 s, and takes 3.6 s.
//   - Two makers of one copy (the gitserver's one-off, the deployer's
//     instance, in two processes) each make their own, under keys of their
//     own, and the first commit wins: the other's goes, nobody waits on a
//     maker that may have died. Within one process, one makes it and the
//     others wait for it.

// remapKept is how many copies of an app's images leases keep: the last two
// made or used (the release that serves and the one before, for a rollback).
// Those its containers are on are kept by the containers in any case.
const remapKept = 2

// remapKeep is how long a lease keeps a copy nothing used since.
var remapKeep = 24 * time.Hour

// The labels of the leases that keep copies: the app's id range (its first
// id) and a digest of the copy's key.
const (
	remapRangeLabel = "bex.co/remap-range"
	remapCopyLabel  = "bex.co/remap-copy"
)

// remapKey names the copy of the image whose layers chain to chainID, for ids
// of m.
func remapKey(chainID string, m idmap) string {
	return fmt.Sprintf("bex-remap-%d-%d-%s", m.host, m.size, chainID)
}

// remapMu serializes the makers of one copy in this process.
var remapMu sync.Map // key -> *sync.Mutex

// withRemappedSnapshot gives the container a new snapshot, id, on the copy of
// img owned by m's range, making the copy when it is not there.
func withRemappedSnapshot(id string, img containerd.Image, m idmap, took *remapTook) containerd.NewContainerOpts {
	return func(ctx context.Context, c *containerd.Client, ctr *containers.Container) error {
		diffIDs, err := img.RootFS(ctx)
		if err != nil {
			return err
		}
		chainID := identity.ChainID(diffIDs).String()
		key := remapKey(chainID, m)
		sn := c.SnapshotService(ctr.Snapshotter)
		mu, _ := remapMu.LoadOrStore(key, &sync.Mutex{})
		mu.(*sync.Mutex).Lock()
		made, err := ensureRemapped(ctx, sn, key, chainID, m)
		mu.(*sync.Mutex).Unlock()
		if err != nil {
			return fmt.Errorf("the image's copy for the app's ids: %w", err)
		}
		if took != nil {
			took.made = made
		}
		for attempt := 0; ; attempt++ {
			if err := keepCopy(ctx, c, ctr.Snapshotter, key, m); err != nil {
				return fmt.Errorf("keep the image's copy: %w", err)
			}
			_, err := sn.Prepare(ctx, id, key)
			if err == nil {
				break
			}
			// The copy's lease expired after ensureRemapped found it, and the
			// collector took it before keepCopy held it again: make it again.
			if !errdefs.IsNotFound(err) || attempt > 0 {
				return err
			}
			mu.(*sync.Mutex).Lock()
			made, err = ensureRemapped(ctx, sn, key, chainID, m)
			mu.(*sync.Mutex).Unlock()
			if err != nil {
				return fmt.Errorf("the image's copy for the app's ids: %w", err)
			}
			if took != nil {
				took.made = made
			}
		}
		ctr.SnapshotKey = id
		ctr.Image = img.Name()
		return nil
	}
}

// keepCopy holds the copy key with its lease (one per copy, named by it, made
// if missing), then lets go of the copies of m's range beyond the remapKept
// newest. Instances of one app made at once keep the same copy through the same
// lease; one whose lease another keeper let go meanwhile (a third copy came)
// makes it again.
func keepCopy(ctx context.Context, c *containerd.Client, snapshotter, key string, m idmap) error {
	sum := sha256.Sum256([]byte(key))
	tag, rng := hex.EncodeToString(sum[:16]), strconv.FormatUint(uint64(m.host), 10)
	lm := c.LeasesService()
	l := leases.Lease{ID: "bex-remap-" + rng + "-" + tag}
	for attempt := 0; ; attempt++ {
		made, err := lm.Create(ctx, leases.WithID(l.ID), leases.WithExpiration(remapKeep),
			leases.WithLabels(map[string]string{remapRangeLabel: rng, remapCopyLabel: tag}))
		switch {
		case err == nil:
			l = made
		case !errdefs.IsAlreadyExists(err):
			return err
		}
		err = lm.AddResource(ctx, l, leases.Resource{ID: key, Type: "snapshots/" + snapshotter})
		if err == nil {
			break
		}
		if !errdefs.IsNotFound(err) || attempt == 2 {
			return err
		}
	}
	all, err := lm.List(ctx, fmt.Sprintf("labels.%q==%s", remapRangeLabel, rng))
	if err != nil {
		return err
	}
	// Newest first, this one before all.
	sort.SliceStable(all, func(i, j int) bool {
		if (all[i].ID == l.ID) != (all[j].ID == l.ID) {
			return all[i].ID == l.ID
		}
		return all[i].CreatedAt.After(all[j].CreatedAt)
	})
	kept := map[string]bool{}
	for _, o := range all {
		copyTag := o.Labels[remapCopyLabel]
		if o.ID == l.ID || (!kept[copyTag] && len(kept) < remapKept) {
			kept[copyTag] = true
			continue
		}
		if err := lm.Delete(ctx, o); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// dropCopies lets go of every copy of the range from host on (its app was
// deleted): the collector takes them once no container is on them.
func dropCopies(ctx context.Context, c *containerd.Client, host uint32) error {
	lm := c.LeasesService()
	all, err := lm.List(ctx, fmt.Sprintf("labels.%q==%d", remapRangeLabel, host))
	if err != nil {
		return err
	}
	for _, o := range all {
		if err := lm.Delete(ctx, o); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// remapTook says whether the copy was made for this container.
type remapTook struct{ made bool }

// ensureRemapped makes the committed snapshot key, parent's files owned by m's
// range, unless it is there. It reports whether it made it.
func ensureRemapped(ctx context.Context, sn snapshots.Snapshotter, key, parent string, m idmap) (bool, error) {
	if _, err := sn.Stat(ctx, key); err == nil {
		return false, nil
	} else if !errdefs.IsNotFound(err) {
		return false, err
	}
	// A key of this maker's own: a maker in another process, or one that died
	// (its snapshot goes with the lease of its NewContainer), is never waited on.
	tmp := fmt.Sprintf("%s-making-%d-%d", key, os.Getpid(), remapSeq.Add(1))
	mounts, err := sn.Prepare(ctx, tmp, parent)
	if err != nil {
		return false, err
	}
	if err := chownMounts(ctx, mounts, m); err != nil {
		_ = sn.Remove(context.WithoutCancel(ctx), tmp)
		return false, err
	}
	if err := sn.Commit(ctx, key, tmp); err != nil {
		_ = sn.Remove(context.WithoutCancel(ctx), tmp)
		if errdefs.IsAlreadyExists(err) {
			return false, nil // another maker's commit came first; it is the same copy
		}
		return false, err
	}
	return true, nil
}

// remapSeq tells this process's makers' keys apart.
var remapSeq atomic.Uint64

// chownMounts mounts the snapshot (an overlay made volatile: no sync per
// copy-up), gives every file of it the owner m maps its owner to, and syncs the
// upper directory's filesystem once.
func chownMounts(ctx context.Context, mounts []mount.Mount, m idmap) error {
	volatile := make([]mount.Mount, len(mounts))
	upper := ""
	for i, mt := range mounts {
		volatile[i] = mt
		if mt.Type == "overlay" {
			volatile[i].Options = append(append([]string(nil), mt.Options...), "volatile")
			for _, o := range mt.Options {
				if u, ok := strings.CutPrefix(o, "upperdir="); ok {
					upper = u
				}
			}
		}
	}
	chown := func(root string) error { return filepath.WalkDir(root, chownTo(m)) }
	err := withTempMount(volatile, chown)
	if errors.Is(err, unix.EINVAL) && upper != "" {
		// A kernel without overlayfs' volatile (before 5.10): synced copy-ups.
		upper = ""
		err = withTempMount(mounts, chown)
	}
	if err != nil {
		return err
	}
	if upper == "" {
		return nil
	}
	// The copy-ups were not synced: the upper directory's filesystem is, once,
	// before the commit. (volatile also left its mark in the work directory,
	// which refuses that directory to a new mount: harmless, as the snapshot
	// is committed next, or removed, and a committed one is only a lower layer.)
	f, err := os.Open(upper)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync the copy: %w", err)
	}
	return nil
}

// chownTo gives each file the owner m maps its owner to, keeping the setuid,
// setgid and sticky bits that a chown clears, never following a symlink.
func chownTo(m idmap) fs.WalkDirFunc {
	return func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if st.Uid >= m.size || st.Gid >= m.size {
			return fmt.Errorf("%s is owned by %d:%d, outside the %d ids of an app", path, st.Uid, st.Gid, m.size)
		}
		if err := os.Lchown(path, int(m.host+st.Uid), int(m.host+st.Gid)); err != nil {
			return err
		}
		if mode := info.Mode(); mode&fs.ModeSymlink == 0 && mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			return os.Chmod(path, mode)
		}
		return nil
	}
}

// withTempMount mounts mounts on a directory of its own for fn. It is
// containerd's mount.WithTempMount without its removal of `volatile`, which
// is there for mounts that are mounted again (a volatile overlay's work
// directory refuses a second mount); this one is committed next, or removed.
func withTempMount(mounts []mount.Mount, fn func(root string) error) (err error) {
	root, err := os.MkdirTemp("", "bex-remap-")
	if err != nil {
		return err
	}
	if err := mount.All(mounts, root); err != nil {
		_ = os.Remove(root)
		return fmt.Errorf("mount the copy: %w", err)
	}
	defer func() {
		if uerr := mount.UnmountAll(root, 0); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount the copy: %w", uerr))
			return // Remove would fail on a mounted directory, and leak nothing of it.
		}
		err = errors.Join(err, os.Remove(root))
	}()
	return fn(root)
}
