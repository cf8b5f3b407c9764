// Package du measures directory trees as `du -sbx` does: the apparent size of
// every file and directory (symbolic links as links), each inode once however
// many hard links name it, without crossing into another file system (a
// network namespace or a container's root mounted below the tree).
package du

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Counter adds up trees, counting each inode once across all of them.
type Counter struct {
	seen map[[2]uint64]bool
}

// Bytes is the size of the tree at path, as `du -sbx path` says. A path that
// does not exist is 0; a file that goes while the walk runs is skipped.
func Bytes(path string) (int64, error) {
	var c Counter
	return c.Add(path)
}

// Add is the bytes under path that this Counter has not counted yet.
func (c *Counter) Add(path string) (int64, error) {
	if c.seen == nil {
		c.seen = map[[2]uint64]bool{}
	}
	root, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	rst, ok := root.Sys().(*syscall.Stat_t)
	if !ok {
		return root.Size(), nil
	}
	var total int64
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if uint64(st.Dev) != uint64(rst.Dev) {
			// Another file system mounted here: not this tree's bytes.
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		key := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
		if c.seen[key] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		c.seen[key] = true
		total += fi.Size()
		return nil
	})
	return total, err
}
