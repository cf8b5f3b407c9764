package volumearchive

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// IDRangeSize is the length of an app's uid and gid range: the container's ids
// 0 to 65535 are host ids base to base+65535 (the local runtime's
// local.IDRangeSize; 0 to 65535 inside a pod of a cluster, base 0).
const IDRangeSize = 65536

// ErrBadArchive is wrapped by Restore's errors about the archive itself (as
// opposed to failures of the machine): the sender can fix those.
var ErrBadArchive = errors.New("bad archive")

func badArchive(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadArchive, fmt.Sprintf(format, args...))
}

// Write writes the contents of root to w as a tar archive (PAX). Names are
// relative to root, ids are the container's: host id base is 0 (ids outside
// the range of IDRangeSize from base are written as 65534). Fifos and sockets
// are left out. Only modification times are kept, so two backups of the same
// files are the same bytes. Nothing is followed out of root.
func Write(ctx context.Context, root *os.Root, base uint32, w io.Writer) error {
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
		// Exactly the size announced: a file that changed while it was read
		// (an app that writes meanwhile) must not break the archive.
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

// StagingPrefix names Restore's staging directories in the root.
const StagingPrefix = ".bex-restore-"

// Restore replaces the contents of root with the archive read from r, whose ids
// are the container's (0 is host id base). It extracts into a staging
// directory in root (StagingPrefix and a random suffix) and swaps it in at the
// end: an archive it refuses (an error wrapping ErrBadArchive) or a failure
// while extracting leaves root as it was. ENOSPC while extracting (root's file
// system is full: blocks or inodes) is a refusal too, the sender's to fix.
func Restore(ctx context.Context, root *os.Root, base uint32, r io.Reader) error {
	// A staging directory left by a restore that was killed goes first.
	if ents, err := fs.ReadDir(root.FS(), "."); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), StagingPrefix) {
				_ = root.RemoveAll(e.Name())
			}
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	staging := StagingPrefix + hex.EncodeToString(rnd[:])
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
