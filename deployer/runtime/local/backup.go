package local

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// Volumes reads and replaces the contents of an app's volumes on this machine:
// their usage, and backups as tar streams (volumes:backup, volumes:restore). The
// gitserver uses it; the deployer makes and mounts the volumes.
//
// Consistency: the app's containers that mount the volume (instances and
// one-offs) are paused (containerd's task Pause: the cgroup freezer) while the
// archive is read or written, and resumed after, so a backup is one moment of
// the volume, and a restore is never seen half done. A paused instance answers
// nothing meanwhile.
//
// Starts: a backup or restore holds the volume's data lock (the flock of
// <name>.data.lock beside its image) exclusively while it pauses, copies and
// resumes; the start of an instance or one-off that mounts the volume, by the
// deployer or the gitserver, holds it shared from the task's creation until it
// runs (volumelock.go). So a start during a backup waits for its end (it says
// so in its process's log), and a backup that begins during a start finds the
// task running and pauses it. The bound: a backup or restore is cancelled after
// Config.VolumeTransferTimeout (default 1h), even with its stream stalled, its
// containers resumed (a cancelled restore leaves the volume as it was); a start
// waits at most that and a minute, then fails (an instance's supervisor tries
// again). The deployer's health checks do not count checks that fail while the
// task is paused. Should the gitserver die mid-backup, the kernel drops its
// lock but its containers stay frozen: the deployer resumes a task that is
// paused with nobody holding its volumes' data locks (it watches containerd's
// TaskPaused events, and the tasks it adopts or health-checks paused).
//
// The host side never follows a link out of the volume: every path is opened
// through an os.Root of the mounted volume, and a restore refuses, before it
// writes anything that stays, an archive with an absolute name, a '..'
// segment, a path through a symbolic link, a hard link out of it, a device
// node, or that is not a well-formed tar. It extracts into a staging directory
// inside the volume and swaps it in at the end, so a refused archive leaves the
// volume as it was, and the volume's size bounds what an archive can write.
type Volumes struct {
	cfg Config
	cd  *containerd.Client
	log *slog.Logger
}

// NewVolumes connects to containerd (to pause the app's containers) with cfg,
// the deployer's runtime Config.
func NewVolumes(cfg Config, log *slog.Logger) (*Volumes, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("local volumes: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cd, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("local volumes: cannot reach containerd at %s: %w", cfg.Address, err)
	}
	return &Volumes{cfg: cfg, cd: cd, log: log.With("component", "runtime/local/volumes")}, nil
}

// Close closes the containerd connection.
func (v *Volumes) Close() error { return v.cd.Close() }

// Usage is the volume's bytes in use and its size; an error wrapping
// os.ErrNotExist when it is not mounted on this machine.
func (v *Volumes) Usage(key types.NamespacedName, name string) (used, size int64, err error) {
	return v.cfg.VolumeUsage(key, name)
}

// ErrBadArchive is wrapped by Restore's errors about the archive itself (as
// opposed to failures of the machine): the sender can fix those.
var ErrBadArchive = errors.New("bad archive")

func badArchive(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadArchive, fmt.Sprintf(format, args...))
}

// volumeRootOwner reads the app's first host id from the volume's root, which
// ensureVolume made it own: the ids of the archive are relative to it.
func volumeRootOwner(dir string) (uint32, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil {
		return 0, err
	}
	return st.Uid, nil
}

// open returns the mounted volume as a Root, and its owner's id.
func (v *Volumes) open(key types.NamespacedName, name string) (*os.Root, uint32, error) {
	if !volumeNameOK(name) {
		return nil, 0, fmt.Errorf("volume %q: %w", name, os.ErrNotExist)
	}
	dir := v.cfg.VolumeDir(key, name)
	if ok, err := isMountPoint(dir); err != nil || !ok {
		return nil, 0, fmt.Errorf("volume %s of %s is not mounted on this machine: %w", name, key.Name, os.ErrNotExist)
	}
	base, err := volumeRootOwner(dir)
	if err != nil {
		return nil, 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, 0, err
	}
	return root, base, nil
}

// lockData makes the backups and restores of one volume take turns, on this
// machine, across processes (its own lock file: the deployer's lock of the volume
// is not held for the length of a transfer).
func (v *Volumes) lockData(key types.NamespacedName, name string) (unlock func(), err error) {
	return v.cfg.lockVolume(key, name+".data")
}

// pause pauses the running tasks of the app's containers that mount the
// volume, and returns what resumes them.
func (v *Volumes) pause(ctx context.Context, key types.NamespacedName, name string) (resume func(), err error) {
	ctx = namespaces.WithNamespace(ctx, v.cfg.Namespace)
	ctrs, err := v.cd.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelNamespace, key.Namespace, labelApp, key.Name))
	if err != nil {
		return nil, fmt.Errorf("list containers of %s: %w", key, err)
	}
	var paused []containerd.Task
	resume = func() {
		rctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), v.cfg.Namespace), 30*time.Second)
		defer cancel()
		for _, t := range paused {
			if err := t.Resume(rctx); err != nil {
				v.log.Warn("resume after a volume's backup or restore", "app", key.String(), "container", t.ID(), "err", err)
			}
		}
	}
	for _, ctr := range ctrs {
		l, err := ctr.Labels(ctx)
		if err != nil || !labelHasVolume(l, name) {
			continue
		}
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			continue // no task: nothing writes
		}
		st, err := task.Status(ctx)
		if err != nil || st.Status != containerd.Running {
			continue
		}
		if err := task.Pause(ctx); err != nil {
			resume()
			return nil, fmt.Errorf("pause %s: %w", ctr.ID(), err)
		}
		paused = append(paused, task)
	}
	return resume, nil
}

// Backup writes the volume's contents to w as a tar archive (PAX), the app's
// containers that mount it paused meanwhile. Names are relative to the volume's
// root, ids are the container's (0 is the app's root).
func (v *Volumes) Backup(ctx context.Context, key types.NamespacedName, name string, w io.Writer) error {
	root, base, err := v.open(key, name)
	if err != nil {
		return err
	}
	defer root.Close()
	unlock, err := v.lockData(key, name)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(ctx, v.cfg.VolumeTransferTimeout)
	defer cancel()
	resume, err := v.pause(ctx, key, name)
	if err != nil {
		return err
	}
	defer resume()
	return streamOut(ctx, v.cfg.VolumeTransferTimeout, w, func(w io.Writer) error { return writeTar(ctx, root, base, w) })
}

func writeTar(ctx context.Context, root *os.Root, base uint32, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{} // (dev, inode) of files with more than one link → first name
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p == "." {
			return nil
		}
		fi, err := root.Lstat(p)
		if err != nil {
			return err
		}
		if t := fi.Mode().Type(); t != 0 && t != fs.ModeDir && t != fs.ModeSymlink {
			// Sockets and fifos (an app may make them; device nodes it cannot) are
			// not data, and a restore refuses them: left out, so that a backup of
			// any volume can be restored.
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = p
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		// Only the modification time: access and change times differ on every
		// read, and two backups of the same files should be the same bytes.
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = containerID32(st.Uid, base), containerID32(st.Gid, base)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				k := [2]uint64{uint64(st.Dev), st.Ino}
				if first, ok := links[k]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[k] = p
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		// Exactly the size announced: the app is paused, but a file that changed
		// anyway must not break the archive.
		n, err := io.CopyN(tw, f, hdr.Size)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: %w", p, err)
		}
		if n < hdr.Size {
			return fmt.Errorf("%s shrank while it was read", p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// containerID32 is host id h as the container sees it: unmapped ids are nobody.
func containerID32(h, base uint32) int {
	if h >= base && h-base < IDRangeSize {
		return int(h - base)
	}
	return 65534
}

// Restore replaces the volume's contents with the archive read from r, the app's
// containers that mount it paused meanwhile. An archive it refuses (an error
// wrapping ErrBadArchive) or a failure leaves the volume as it was.
func (v *Volumes) Restore(ctx context.Context, key types.NamespacedName, name string, r io.Reader) error {
	root, base, err := v.open(key, name)
	if err != nil {
		return err
	}
	defer root.Close()
	unlock, err := v.lockData(key, name)
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(ctx, v.cfg.VolumeTransferTimeout)
	defer cancel()
	resume, err := v.pause(ctx, key, name)
	if err != nil {
		return err
	}
	defer resume()
	return streamIn(ctx, v.cfg.VolumeTransferTimeout, r, func(r io.Reader) error { return restoreTar(ctx, root, base, r) })
}

// stagingPrefix names restore's staging directories in a volume's root.
const stagingPrefix = ".bex-restore-"

func restoreTar(ctx context.Context, root *os.Root, base uint32, r io.Reader) error {
	// A staging directory left by a restore that was killed goes first.
	if ents, err := fs.ReadDir(root.FS(), "."); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), stagingPrefix) {
				_ = root.RemoveAll(e.Name())
			}
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	staging := stagingPrefix + hex.EncodeToString(rnd[:])
	if err := root.Mkdir(staging, 0o700); err != nil {
		return err
	}
	if err := extract(ctx, root, staging, base, r); err != nil {
		if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, ErrBadArchive) {
			// Its blocks or its inodes: the volume's size bounds what an archive
			// may hold, which is the sender's to fix.
			err = badArchive("the volume is full: the archive does not fit beside its current files (%v)", err)
		}
		if rerr := root.RemoveAll(staging); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the staging directory: %w", rerr))
		}
		return err
	}
	// Swap: the old contents go, the staged ones take their place.
	ents, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == staging {
			continue
		}
		if err := root.RemoveAll(e.Name()); err != nil {
			return fmt.Errorf("remove the old contents: %w", err)
		}
	}
	staged, err := fs.ReadDir(root.FS(), staging)
	if err != nil {
		return err
	}
	for _, e := range staged {
		if err := root.Rename(staging+"/"+e.Name(), e.Name()); err != nil {
			return fmt.Errorf("move the restored contents in place: %w", err)
		}
	}
	return root.Remove(staging)
}

// entryName checks a tar entry's name and returns it cleaned, relative to the
// volume; "" for the root itself.
func entryName(n string) (string, error) {
	if n == "" || strings.ContainsRune(n, 0) {
		return "", badArchive("an entry has an empty or malformed name")
	}
	if strings.HasPrefix(n, "/") {
		return "", badArchive("%q is an absolute path: archive names must be relative to the volume", n)
	}
	for _, seg := range strings.Split(n, "/") {
		if seg == ".." {
			return "", badArchive("%q has a '..' segment: it would land outside the volume", n)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// extract writes the archive's entries under dir in root.
func extract(ctx context.Context, root *os.Root, dir string, base uint32, r io.Reader) error {
	tr := tar.NewReader(r)
	entries := 0
	// Directories get their times last: what is made in them changes them.
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirTimes []dirTime
	defer func() {
		for i := len(dirTimes) - 1; i >= 0; i-- {
			_ = root.Chtimes(dirTimes[i].path, dirTimes[i].t, dirTimes[i].t)
		}
	}()
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if entries == 0 {
				return badArchive("no entries: not a tar archive, or an empty one")
			}
			return nil
		}
		if err != nil {
			return badArchive("not a well-formed tar archive: %v", err)
		}
		entries++
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if name == "" {
			continue // the root's own entry ("./"): the volume's root stays as it is
		}
		// Every parent must be a directory this archive made (or made
		// implicitly), never a symbolic link: nothing is written through a link.
		target := dir + "/" + name
		if err := mkParents(root, dir, name, base); err != nil {
			return err
		}
		mode := os.FileMode(hdr.Mode & 0o777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := root.Lstat(target); err == nil {
				if !fi.IsDir() {
					return badArchive("%q: a directory where the archive had another file", hdr.Name)
				}
			} else if err := root.Mkdir(target, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = root.Remove(target) // a later entry of the same name wins, as with tar(1)
			f, err := root.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
			if err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
					return badArchive("%s: %v", hdr.Name, err)
				}
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
				return badArchive("%q: a symbolic link without a target", hdr.Name)
			}
			_ = root.Remove(target)
			// Its target is stored, never followed here: inside the app it points
			// where the app's own tree says.
			if err := root.Symlink(hdr.Linkname, target); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			if !hdr.ModTime.IsZero() {
				_ = lchtimes(root, target, hdr.ModTime)
			}
		case tar.TypeLink:
			src, err := entryName(hdr.Linkname)
			if err != nil || src == "" {
				return badArchive("%q: a hard link to %q, outside the archive", hdr.Name, hdr.Linkname)
			}
			if err := checkParents(root, dir, src); err != nil {
				return err
			}
			fi, err := root.Lstat(dir + "/" + src)
			if err != nil || !fi.Mode().IsRegular() {
				return badArchive("%q: a hard link to %q, which is not a file earlier in the archive", hdr.Name, hdr.Linkname)
			}
			_ = root.Remove(target)
			if err := root.Link(dir+"/"+src, target); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			continue // the link shares its file's owner and mode
		default:
			return badArchive("%q: entry type %q is not allowed in a volume (files, directories and links only)", hdr.Name, string(hdr.Typeflag))
		}
		uid, gid := hostID32(hdr.Uid, base), hostID32(hdr.Gid, base)
		if err := root.Lchown(target, int(uid), int(gid)); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// Set-id bits are kept (they are the app's own ids, and the mount is
			// nosuid); after the chown, which clears them.
			if hdr.Mode&0o4000 != 0 {
				mode |= os.ModeSetuid
			}
			if hdr.Mode&0o2000 != 0 {
				mode |= os.ModeSetgid
			}
			if hdr.Mode&0o1000 != 0 {
				mode |= os.ModeSticky
			}
			if err := root.Chmod(target, mode); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			switch {
			case hdr.ModTime.IsZero():
			case hdr.Typeflag == tar.TypeDir:
				dirTimes = append(dirTimes, dirTime{target, hdr.ModTime})
			default:
				_ = root.Chtimes(target, hdr.ModTime, hdr.ModTime)
			}
		}
	}
}

// hostID32 maps a container id of the archive into the app's range; ids beyond
// it (an archive made elsewhere) become the app's root.
func hostID32(id int, base uint32) uint32 {
	if id >= 0 && id < IDRangeSize {
		return base + uint32(id)
	}
	return base
}

// mkParents makes the missing parent directories of name under dir, refusing a
// parent that exists and is not a directory (a symbolic link above all).
func mkParents(root *os.Root, dir, name string, base uint32) error {
	parts := strings.Split(name, "/")
	p := dir
	for _, seg := range parts[:len(parts)-1] {
		p += "/" + seg
		fi, err := root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := root.Lchown(p, int(base), int(base)); err != nil {
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return badArchive("%q goes through %q, which is not a directory in the archive", name, strings.TrimPrefix(p, dir+"/"))
		}
	}
	return nil
}

// checkParents refuses a path whose parents are not all directories.
func checkParents(root *os.Root, dir, name string) error {
	parts := strings.Split(name, "/")
	p := dir
	for _, seg := range parts[:len(parts)-1] {
		p += "/" + seg
		fi, err := root.Lstat(p)
		if err != nil || !fi.IsDir() {
			return badArchive("%q goes through %q, which is not a directory in the archive", name, strings.TrimPrefix(p, dir+"/"))
		}
	}
	return nil
}

// lchtimes sets a symbolic link's own times (os.Root has no Lchtimes): through
// its parent directory, opened within root.
func lchtimes(root *os.Root, name string, t time.Time) error {
	parent, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	return unix.UtimesNanoAt(int(parent.Fd()), path.Base(name), ts, unix.AT_SYMLINK_NOFOLLOW)
}
