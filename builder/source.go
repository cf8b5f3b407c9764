package builder

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// ErrContextTooLarge is returned when a commit's files exceed the build context limit.
var ErrContextTooLarge = errors.New("build context too large")

// exportCommit writes the files of commit in the bare repository repoDir into dir,
// and returns their total size. It reads objects through go-git and writes only
// below dir, so the repository is never modified. Files go to a private directory,
// not a stream, because BuildKit's local source then hashes and copies only what
// changed between builds, and the Dockerfile frontend applies .dockerignore to it
// as to any context. Symbolic links are written as links; submodules are skipped.
func exportCommit(repoDir, commit, dir string, maxBytes int64) (int64, error) {
	st := filesystem.NewStorage(osfs.New(repoDir), cache.NewObjectLRUDefault())
	c, err := object.GetCommit(st, plumbing.NewHash(commit))
	if err != nil {
		return 0, fmt.Errorf("commit %s: %w", commit, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return 0, fmt.Errorf("tree of %s: %w", commit, err)
	}
	// Files keep the time of the export. BuildKit sends a context incrementally and
	// skips files whose size and time match what it has: fixed times (the commit's)
	// would hide a same-size change made within the same second. Its build cache is
	// keyed on content, so fresh times cost no cache hits.
	var total int64
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for {
		name, entry, err := walker.Next()
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		// Tree entry names cannot contain "/" or be "..", but a repository is user
		// input: refuse anything that would leave dir.
		clean := path.Clean("/" + name)
		if clean != "/"+name || strings.Contains(name, "\x00") {
			return total, fmt.Errorf("unsafe path %q in commit %s", name, commit)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch entry.Mode {
		case filemode.Dir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return total, err
			}
		case filemode.Submodule:
			continue
		case filemode.Symlink:
			blob, err := object.GetBlob(st, entry.Hash)
			if err != nil {
				return total, err
			}
			linkTarget, err := readBlob(blob)
			if err != nil {
				return total, err
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return total, err
			}
			if err := os.Symlink(string(linkTarget), target); err != nil {
				return total, err
			}
		default:
			blob, err := object.GetBlob(st, entry.Hash)
			if err != nil {
				return total, err
			}
			total += blob.Size
			if maxBytes > 0 && total > maxBytes {
				return total, fmt.Errorf("%w: the files of commit %s are more than the limit of %s", ErrContextTooLarge, commit[:7], humanBytes(maxBytes))
			}
			mode := os.FileMode(0o644)
			if entry.Mode == filemode.Executable {
				mode = 0o755
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return total, err
			}
			if err := writeBlob(blob, target, mode); err != nil {
				return total, err
			}
		}
	}
}

func readBlob(b *object.Blob) ([]byte, error) {
	r, err := b.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func writeBlob(b *object.Blob, target string, mode os.FileMode) error {
	r, err := b.Reader()
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
