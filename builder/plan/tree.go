package plan

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// The source tree is pushed by users, so it is not trusted: detection reads only small
// files, and only files inside the tree. A link to /etc/passwd named Procfile must not
// make the planner read a file of the builder's host and quote it in an error.

// maxManifestSize bounds what detection reads of one file: manifests are small.
const maxManifestSize = 4 << 20

// errOutside is why a path that leads out of the tree is refused.
var errOutside = errors.New("it is a link that leads outside the app")

// resolve returns name with the links along it followed, within the tree. A link that
// is absolute or climbs above the root gives errOutside. A file system without links
// (fstest.MapFS, embed.FS, zip) is returned as is.
func (a *app) resolve(name string) (string, error) {
	rl, ok := a.src.(fs.ReadLinkFS)
	if !ok {
		return name, nil
	}
	resolved := "."
	rest := strings.Split(name, "/")
	for links := 0; len(rest) > 0; {
		next := path.Join(resolved, rest[0])
		rest = rest[1:]
		fi, err := rl.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > 40 {
			return "", errors.New("it is a chain of too many links")
		}
		target, err := rl.ReadLink(next)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			return "", errOutside
		}
		joined := path.Join(resolved, target)
		if !fs.ValidPath(joined) { // ".." or "../x": above the root
			return "", errOutside
		}
		// Resolve the target's own components again: they may be links too.
		rest = append(strings.Split(joined, "/"), rest...)
		resolved = "."
	}
	return resolved, nil
}

// stat is fs.Stat within the tree.
func (a *app) stat(name string) (fs.FileInfo, error) {
	r, err := a.resolve(name)
	if err != nil {
		return nil, err
	}
	return fs.Stat(a.src, r)
}

// isFile reports whether name is a regular file of the tree. A link that leads out of
// the tree counts as a file, so that reading it fails with a reason instead of the
// file being silently ignored.
func (a *app) isFile(name string) bool {
	fi, err := a.stat(name)
	return err == nil && fi.Mode().IsRegular() || errors.Is(err, errOutside)
}

// isDir reports whether name is a directory of the tree.
func (a *app) isDir(name string) bool {
	fi, err := a.stat(name)
	return err == nil && fi.IsDir()
}

// readDir lists the directory name of the tree; nothing when there is none.
func (a *app) readDir(name string) ([]fs.DirEntry, error) {
	r, err := a.resolve(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, errOutside) {
		return nil, fmt.Errorf("%s/ cannot be read because %v: bex reads only the app's own files; put the directory itself in its place", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s/: %w", name, err)
	}
	entries, err := fs.ReadDir(a.src, r)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return entries, err
}

// read returns the content of the file name, at most limit bytes of it when limit is
// not 0, else all of it up to maxManifestSize, beyond which it is an error.
func (a *app) read(name string) ([]byte, error) {
	return a.readUpTo(name, 0)
}

func (a *app) readUpTo(name string, limit int64) ([]byte, error) {
	r, err := a.resolve(name)
	if errors.Is(err, errOutside) {
		return nil, fmt.Errorf("%s cannot be read because %v: bex reads only the app's own files; put the file itself in its place", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	f, err := a.src.Open(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	max := limit
	if max == 0 {
		max = maxManifestSize + 1
	}
	data, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if limit == 0 && len(data) > maxManifestSize {
		return nil, fmt.Errorf("%s is larger than %d MiB: bex reads it to plan the build, and expects a small file", name, maxManifestSize>>20)
	}
	return data, nil
}

// ReadFile reads the file name of the tree src as the planner reads a manifest
// (links only while they stay inside the tree), at most limit+1 bytes of it, so
// that a caller can tell a file larger than limit; found is false when there is none.
func ReadFile(src fs.FS, name string, limit int64) (data []byte, found bool, err error) {
	a := &app{src: src}
	if !a.isFile(name) {
		return nil, false, nil
	}
	data, err = a.readUpTo(name, limit+1)
	return data, err == nil, err
}
