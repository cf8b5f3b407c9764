package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"
)

// remappedParent returns the key of a committed snapshot of img's root filesystem
// with every file's owner moved into m (uid u inside is m.host+u outside), making
// it when there is none. It is what containerd's WithUserNSRemappedSnapshot does,
// with one difference that matters: the chown goes through an overlayfs mounted
// "volatile", so the copy-up of each file is not fsynced one by one (20,000 files
// took 30 s that way here); the upper directory's file system is synced once at
// the end, before the commit. ctx must hold a lease.
func (r *Runtime) remappedParent(ctx context.Context, img containerd.Image, m idmap) (string, error) {
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return "", err
	}
	parent := identity.ChainID(diffIDs).String()
	key := fmt.Sprintf("bex-ids-%d-%s", m.host, parent)
	sn := r.cd.SnapshotService(r.cfg.Snapshotter)
	if _, err := sn.Stat(ctx, key); err == nil {
		return key, nil
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tmp := key + "-remap-" + hex.EncodeToString(rnd[:])
	mounts, err := sn.Prepare(ctx, tmp, parent)
	if err != nil {
		return "", fmt.Errorf("prepare the remapped view of %s: %w", img.Name(), err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), tmp) //nolint:errcheck // gone after a commit
	upper := ""
	for i, mnt := range mounts {
		if mnt.Type != "overlay" {
			continue
		}
		mounts[i].Options = append(mounts[i].Options, "volatile")
		for _, o := range mnt.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			}
		}
	}
	if err := mount.WithTempMount(ctx, mounts, func(root string) error {
		return filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid >= m.size || st.Gid >= m.size {
				return fmt.Errorf("%s is owned by %d:%d, outside the %d ids of a user namespace", strings.TrimPrefix(path, root), st.Uid, st.Gid, m.size)
			}
			// Lchown: a symlink is changed, never followed out of the view.
			if err := os.Lchown(path, int(m.host+st.Uid), int(m.host+st.Gid)); err != nil {
				return err
			}
			// chown clears set-uid and set-gid bits: put them back.
			if mode := fi.Mode(); mode&os.ModeSymlink == 0 && mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
				return os.Chmod(path, mode)
			}
			return nil
		})
	}); err != nil {
		return "", fmt.Errorf("chown the files of %s into the app's ids: %w", img.Name(), err)
	}
	if upper != "" {
		if err := syncFS(upper); err != nil {
			return "", fmt.Errorf("sync the remapped view of %s: %w", img.Name(), err)
		}
	}
	if err := sn.Commit(ctx, key, tmp); err != nil && !errdefs.IsAlreadyExists(err) {
		return "", fmt.Errorf("commit the remapped view of %s: %w", img.Name(), err)
	}
	return key, nil
}

// syncFS flushes the file system that holds dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// withRemappedSnapshot makes the container's snapshot id a child of the
// image's view remapped into m.
func (r *Runtime) withRemappedSnapshot(id string, img containerd.Image, m idmap) containerd.NewContainerOpts {
	return func(ctx context.Context, _ *containerd.Client, c *containers.Container) error {
		parent, err := r.remappedParent(ctx, img, m)
		if err != nil {
			return err
		}
		if _, err := r.cd.SnapshotService(r.cfg.Snapshotter).Prepare(ctx, id, parent); err != nil {
			return err
		}
		c.SnapshotKey = id
		c.Snapshotter = r.cfg.Snapshotter
		c.Image = img.Name()
		return nil
	}
}
