package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/bytesize"
)

// A volume on one machine is an ext4 file system in a file of its full size
// (fallocate: the space is taken from the machine's disk when the volume is made,
// so a full volume never fills the platform's disk, and a volume that does not fit
// is refused then), loop-mounted with nosuid,nodev, its root owned by uid 0 of the
// app's user namespace. The file system is what enforces the size: a write beyond
// it fails with ENOSPC inside the app, and the inodes are bounded the same way. The
// root fs of this machine has no project quotas, and a loop file works on any
// file system bex's state dir sits on.
//
// Images live in STATE/volumes/<ns>/<app>/<name>.img (0700 directories: the
// platform's). They are mounted on /run/bex/volumes-<hash of the state dir>/<ns>/
// <app>/<name>, outside the state dir for the reason containerd's state is
// (daemons.Containerd.State): runc reaches a bind mount's source from inside the
// app's user namespace, so every directory above it must be searchable, and a
// state dir under /root is not. The app's directory there is root's, 0710, its
// group the app's host gid 0: no other app's ids can pass it, and the app cannot
// write in it. Both the deployer (instances)
// and the gitserver (one-offs, backups) make and mount volumes, so each step is
// idempotent and runs under an flock of the image's lock file.

// labelVolumes on a container lists the volumes it mounts, comma-separated, so
// that a volume is not deleted under a container that still has it, and a backup
// pauses exactly the containers that write to it.
const labelVolumes = "app.bex.co/volumes"

// volumeImageDir holds an app's volume images.
func (cfg Config) volumeImageDir(key types.NamespacedName) string {
	return filepath.Join(cfg.StateDir, "volumes", key.Namespace, key.Name)
}

// volumeMountRoot is where the volumes of this state dir are mounted.
func (cfg Config) volumeMountRoot() string {
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		abs = cfg.StateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join("/run/bex", "volumes-"+hex.EncodeToString(sum[:6]))
}

// VolumeDir is where the volume name of app is mounted on this host.
func (cfg Config) VolumeDir(key types.NamespacedName, name string) string {
	return filepath.Join(cfg.withDefaults().volumeMountRoot(), key.Namespace, key.Name, name)
}

func (cfg Config) volumeImage(key types.NamespacedName, name string) string {
	return filepath.Join(cfg.volumeImageDir(key), name+".img")
}

// volumeNameOK guards the names that become paths (the API's pattern, checked
// again: a name reaches here from labels and directory listings too).
func volumeNameOK(name string) bool {
	if name == "" || len(name) > 30 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return !strings.HasSuffix(name, "-")
}

// minFreeAfterVolume is how much of the state dir's disk a new volume must
// leave free, besides its own size: the platform's own writes (images, logs,
// etcd) keep room.
func minFreeAfterVolume(total uint64) uint64 { return max(total/10, 1<<30) }

// lockVolume takes the flock of one volume's image, shared by every process on
// this machine that makes, mounts or removes it.
func (cfg Config) lockVolume(key types.NamespacedName, name string) (unlock func(), err error) {
	f, err := cfg.openVolumeLock(key, name)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock volume %s: %w", name, err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// openVolumeLock opens (making it) the lock file name+".lock" of app key's volumes.
func (cfg Config) openVolumeLock(key types.NamespacedName, name string) (*os.File, error) {
	dir := cfg.volumeImageDir(key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
}

// ensureVolume makes volume v of app key if it does not exist (owned by hostID,
// the app's host uid 0) and mounts it if it is not mounted. It returns the
// mounted directory.
func (cfg Config) ensureVolume(key types.NamespacedName, v appv1.Volume, hostID uint32) (string, error) {
	if !volumeNameOK(v.Name) {
		return "", fmt.Errorf("volume name %q: want lower-case letters, digits and '-'", v.Name)
	}
	unlock, err := cfg.lockVolume(key, v.Name)
	if err != nil {
		return "", err
	}
	defer unlock()
	img := cfg.volumeImage(key, v.Name)
	made := false
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if err := makeVolumeImage(img, v.Size.Value(), hostID); err != nil {
			return "", fmt.Errorf("volume %s: %w", v.Name, err)
		}
		made = true
	} else if err != nil {
		return "", err
	}
	dir, err := cfg.mountVolume(key, v.Name, img, hostID)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", v.Name, err)
	}
	if made {
		// mkfs's lost+found is root's: the app would see a directory of nobody's.
		// e2fsck makes it again should it ever need one.
		if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return dir, nil
}

// makeVolumeImage writes an ext4 file system of size bytes into a new file at
// img, its root directory owned by hostID.
func makeVolumeImage(img string, size int64, hostID uint32) error {
	if size < appv1.MinVolumeSize || size > appv1.MaxVolumeSize {
		return fmt.Errorf("size %d bytes: a volume's size goes from 16Mi to 16Ti", size)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(img), &fs); err != nil {
		return err
	}
	total, free := fs.Blocks*uint64(fs.Bsize), fs.Bavail*uint64(fs.Bsize)
	if need := uint64(size) + minFreeAfterVolume(total); free < need {
		return fmt.Errorf("the disk holding bex's state has %s free; a volume of %s must leave %s: free some space (system:prune) or ask for a smaller size",
			bytesize.Format(int64(free)), bytesize.Format(size), bytesize.Format(int64(minFreeAfterVolume(total))))
	}
	tmp := img + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("allocate %s: %w", bytesize.Format(size), err)
	}
	// -m 0: no blocks reserved for the host's root, the app has all of it;
	// nodiscard: a discard would punch the preallocated blocks out of the file.
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", fmt.Sprintf("root_owner=%d:%d,nodiscard", hostID, hostID), tmp).CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, img)
}

// mountVolume mounts img on the volume's directory unless it is mounted there.
func (cfg Config) mountVolume(key types.NamespacedName, name, img string, hostID uint32) (string, error) {
	root := cfg.volumeMountRoot()
	nsDir := filepath.Join(root, key.Namespace)
	appDir := filepath.Join(nsDir, key.Name)
	dir := filepath.Join(appDir, name)
	for _, d := range []string{"/run/bex", root, nsDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(appDir, 0o710); err != nil {
		return "", err
	}
	// Root's, searchable by the app's group only: runc, inside the app's user
	// namespace (gid 0 there is hostID here), reaches the bind's source through
	// it; no other app's ids pass, and the app cannot write in it.
	if err := os.Lchown(appDir, 0, int(hostID)); err != nil {
		return "", err
	}
	if err := os.Chmod(appDir, 0o710); err != nil {
		return "", err
	}
	// The mount point itself is root's and 0700 while nothing is mounted on it:
	// should an instance ever bind it unmounted, it could not write there.
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return "", err
	}
	if mounted {
		return dir, nil
	}
	out, err := exec.Command("mount", "-t", "ext4", "-o", "loop,nosuid,nodev", img, dir).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mount: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return dir, nil
}

// isMountPoint reports whether something is mounted on dir (its device differs
// from its parent's).
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// removeVolume unmounts the volume and deletes its image: its data is gone.
func (cfg Config) removeVolume(key types.NamespacedName, name string) error {
	if !volumeNameOK(name) {
		return fmt.Errorf("volume name %q: not a volume", name)
	}
	unlock, err := cfg.lockVolume(key, name)
	if err != nil {
		return err
	}
	defer unlock()
	dir := filepath.Join(cfg.volumeMountRoot(), key.Namespace, key.Name, name)
	if mounted, err := isMountPoint(dir); err == nil && mounted {
		// Detached rather than refused when busy: no container has it (the
		// caller checked), so what holds it is a host process passing by, and
		// the loop device goes when it lets go.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount volume %s: %w", name, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(cfg.volumeImage(key, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	_ = os.Remove(filepath.Join(cfg.volumeImageDir(key), name+".lock"))
	return nil
}

// volumesOnDisk lists the names of app's volume images.
func (cfg Config) volumesOnDisk(key types.NamespacedName) ([]string, error) {
	ents, err := os.ReadDir(cfg.volumeImageDir(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".img"); ok && volumeNameOK(name) && e.Type().IsRegular() {
			out = append(out, name)
		}
	}
	return out, nil
}

// mountAllVolumes mounts every volume image of the state dir that is not
// mounted: after a reboot, before adopted containers are started again, so that
// none of them starts on an empty mount point.
func (cfg Config) mountAllVolumes(ids func(app string) (uint32, bool)) error {
	base := filepath.Join(cfg.StateDir, "volumes")
	nss, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		apps, err := os.ReadDir(filepath.Join(base, ns.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, app := range apps {
			key := types.NamespacedName{Namespace: ns.Name(), Name: app.Name()}
			names, err := cfg.volumesOnDisk(key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			hostID, ok := ids(key.String())
			if !ok {
				// An app whose ids are gone has no instance to mount it in; its
				// next Sync allocates them and mounts its volumes.
				continue
			}
			for _, name := range names {
				func() {
					unlock, err := cfg.lockVolume(key, name)
					if err != nil {
						errs = append(errs, err)
						return
					}
					defer unlock()
					if _, err := cfg.mountVolume(key, name, cfg.volumeImage(key, name), hostID); err != nil {
						errs = append(errs, fmt.Errorf("volume %s of %s: %w", name, key, err))
					}
				}()
			}
		}
	}
	return errors.Join(errs...)
}

// volumeMounts are the OCI mounts of the volumes in vols, each checked to be
// mounted now: an instance never starts with a volume's empty mount point.
func (cfg Config) volumeMounts(key types.NamespacedName, vols []appv1.Volume) ([]specs.Mount, error) {
	var out []specs.Mount
	for _, v := range vols {
		dir := cfg.VolumeDir(key, v.Name)
		mounted, err := isMountPoint(dir)
		if err != nil || !mounted {
			return nil, fmt.Errorf("volume %s is not mounted yet (%v): try again in a moment", v.Name, err)
		}
		out = append(out, specs.Mount{Destination: v.Path, Type: "bind", Source: dir,
			Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	return out, nil
}

// volumesOf are the volumes the instances of process mount.
func volumesOf(vols []appv1.Volume, process string) []appv1.Volume {
	var out []appv1.Volume
	for _, v := range vols {
		if v.MountedIn(process) {
			out = append(out, v)
		}
	}
	return out
}

func volumeNames(vols []appv1.Volume) string {
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = v.Name
	}
	return strings.Join(names, ",")
}

// withVolumes adds the mounts to a spec.
func withVolumes(m []specs.Mount) oci.SpecOpts {
	return oci.WithMounts(m)
}

// VolumeUsage is a mounted volume's size and the bytes in use, from its file
// system. An error wrapping os.ErrNotExist when it is not mounted here.
func (cfg Config) VolumeUsage(key types.NamespacedName, name string) (used, size int64, err error) {
	if !volumeNameOK(name) {
		return 0, 0, fmt.Errorf("volume %q: %w", name, os.ErrNotExist)
	}
	dir := cfg.VolumeDir(key, name)
	mounted, err := isMountPoint(dir)
	if err != nil || !mounted {
		return 0, 0, fmt.Errorf("volume %s is not mounted: %w", name, os.ErrNotExist)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, 0, err
	}
	return int64(fs.Blocks-fs.Bfree) * fs.Bsize, int64(fs.Blocks) * fs.Bsize, nil
}

// labelHasVolume reports whether a container's labels say it mounts volume name.
func labelHasVolume(l map[string]string, name string) bool {
	return slices.Contains(strings.Split(l[labelVolumes], ","), name)
}

// syncVolumes makes and mounts each volume of d and deletes the app's other
// volumes that no container of the app (instance or one-off, of this process
// or another) still has. It reports them all, and a failure when a volume of d
// is not ready: no instance is started without its volumes.
func (r *Runtime) syncVolumes(ctx context.Context, d runtime.Desired) ([]appv1.VolumeStatus, *failure, error) {
	key := d.Key()
	var out []appv1.VolumeStatus
	var f *failure
	want := map[string]bool{}
	if len(d.Volumes) > 0 {
		hostID, err := r.store.ids(key.String())
		if err != nil {
			return nil, nil, err
		}
		for _, v := range d.Volumes {
			want[v.Name] = true
			vs := appv1.VolumeStatus{Name: v.Name, Ready: true}
			if _, err := r.cfg.ensureVolume(key, v, hostID); err != nil {
				vs.Ready, vs.Message = false, err.Error()
				r.log.Warn("volume", "app", key.String(), "volume", v.Name, "err", err)
				if f == nil {
					f = &failure{reason: appv1.VolumeFailedReason, message: err.Error()}
				}
			} else if fi, err := os.Stat(r.cfg.volumeImage(key, v.Name)); err == nil && fi.Size() != v.Size.Value() {
				// Said, not done: the file system keeps the size it was made with.
				vs.Message = fmt.Sprintf("its size is %s, fixed when it was made (the spec asks for %s)", bytesize.Format(fi.Size()), v.Size.String())
			}
			out = append(out, vs)
		}
	}
	onDisk, err := r.cfg.volumesOnDisk(key)
	if err != nil {
		return nil, nil, err
	}
	var gone []string
	for _, name := range onDisk {
		if !want[name] {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return out, f, nil
	}
	users, err := r.volumeUsers(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range gone {
		if by := users[name]; len(by) > 0 {
			out = append(out, appv1.VolumeStatus{Name: name, Message: "being deleted once " + strings.Join(by, ", ") + " stops"})
			continue
		}
		if err := r.cfg.removeVolume(key, name); err != nil {
			out = append(out, appv1.VolumeStatus{Name: name, Message: "being deleted: " + err.Error()})
			continue
		}
		r.log.Info("volume deleted", "app", key.String(), "volume", name)
	}
	return out, f, nil
}

// volumeUsers maps each volume of the app to the containers that have it.
func (r *Runtime) volumeUsers(ctx context.Context, key types.NamespacedName) (map[string][]string, error) {
	ctrs, err := r.cd.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelNamespace, key.Namespace, labelApp, key.Name))
	if err != nil {
		return nil, fmt.Errorf("list containers of %s: %w", key, err)
	}
	out := map[string][]string{}
	for _, ctr := range ctrs {
		l, err := ctr.Labels(ctx)
		if errdefs.IsNotFound(err) {
			// Removed since the list (a replacement's cleanup, a one-off that
			// ended): it holds no volume any more.
			continue
		}
		if err != nil {
			return nil, err
		}
		for name := range strings.SplitSeq(l[labelVolumes], ",") {
			if name != "" {
				out[name] = append(out[name], l[labelProcess])
			}
		}
	}
	return out, nil
}

// removeAllVolumes deletes every volume of the app (its deletion).
func (r *Runtime) removeAllVolumes(key types.NamespacedName) error {
	names, err := r.cfg.volumesOnDisk(key)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := r.cfg.removeVolume(key, name); err != nil {
			return err
		}
	}
	// What is left are lock files (of volumes that could not be made, too).
	if err := os.RemoveAll(r.cfg.volumeImageDir(key)); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(r.cfg.volumeMountRoot(), key.Namespace, key.Name))
	return nil
}

// UnmountVolumes unmounts every volume of the runtime state dir stateDir, for
// bex up's stop once the apps' containers are gone: nothing of bex stays
// mounted, and the next start's runtime mounts them again before it adopts the
// containers.
func UnmountVolumes(stateDir string) error {
	root := Config{StateDir: stateDir}.volumeMountRoot()
	var errs []error
	nss, _ := os.ReadDir(root)
	for _, ns := range nss {
		apps, _ := os.ReadDir(filepath.Join(root, ns.Name()))
		for _, app := range apps {
			vols, _ := os.ReadDir(filepath.Join(root, ns.Name(), app.Name()))
			for _, v := range vols {
				dir := filepath.Join(root, ns.Name(), app.Name(), v.Name())
				if ok, err := isMountPoint(dir); err == nil && ok {
					if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
						errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// VolumeBytes is the bytes the app's volumes take in the runtime state dir
// stateDir: the apparent size of their images (as du -b counts them), which is
// their full size, allocated when each was made.
func VolumeBytes(stateDir string, key types.NamespacedName) (int64, error) {
	cfg := Config{StateDir: stateDir}
	names, err := cfg.volumesOnDisk(key)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, name := range names {
		fi, err := os.Stat(cfg.volumeImage(key, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n += fi.Size()
	}
	return n, nil
}
