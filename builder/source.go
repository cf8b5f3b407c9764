package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"bex.co/bex/internal/bytesize"
)

// ErrContextTooLarge is returned when a commit's files exceed the build context limit
// (its bytes or its number of files).
var ErrContextTooLarge = errors.New("build context too large")

// ErrUnsafeTree is returned when a commit's tree cannot be written without following
// one of its own links, or holds a name that is not a file name.
var ErrUnsafeTree = errors.New("unsafe tree")

// maxLinkTarget bounds a symbolic link's target: the kernel refuses longer ones.
const maxLinkTarget = 4096

// exportLimits bound one export.
type exportLimits struct {
	maxBytes int64 // the files' content
	maxFiles int   // files, directories and links
}

// exportCommit writes the files of commit in the bare repository repoDir into dir
// (which must not exist yet), and returns their total size. It reads objects through
// go-git and writes only below dir, so the repository is never modified. Files go to
// a private directory, not a stream, because BuildKit's local source then hashes and
// copies only what changed between builds, and the Dockerfile frontend applies
// .dockerignore to it as to any context. Symbolic links are written as links;
// submodules are skipped.
//
// The tree is pushed by users, so it is not trusted. Everything is written through an
// os.Root on dir, which resolves nothing outside dir, and no link of the tree is ever
// followed, not even one that points inside: an entry below a link (a link `a` and a
// directory `a/` of the same name), an entry written twice, and a name that is not a
// single file name are refused. The export stops when ctx ends.
func exportCommit(ctx context.Context, repoDir, commit, dir string, lim exportLimits) (int64, error) {
	return exportCommitCached(ctx, repoDir, commit, dir, "", lim)
}

// exportCommitCached is exportCommit with the large files of the last export
// kept in cacheDir (an exportCache; "" for none).
func exportCommitCached(ctx context.Context, repoDir, commit, dir, cacheDir string, lim exportLimits) (int64, error) {
	st := filesystem.NewStorage(osfs.New(repoDir), cache.NewObjectLRUDefault())
	c, err := object.GetCommit(st, plumbing.NewHash(commit))
	if err != nil {
		return 0, fmt.Errorf("commit %s: %w", commit, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return 0, fmt.Errorf("tree of %s: %w", commit, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	e := &exporter{ctx: ctx, st: st, dirs: []openDir{{name: ".", root: root}}, commit: commit[:7], lim: lim, kinds: map[string]filemode.FileMode{},
		cache: openExportCache(cacheDir)}
	defer e.closeDirs(1)
	// Files keep the time of the export, but for large ones (blobTime). BuildKit
	// sends a context incrementally and skips files whose size and time match what
	// it has: fixed times (the commit's) would hide a same-size change made within
	// the same second. Its build cache is keyed on content, so fresh times cost no
	// cache hits; they cost sending every file again, which only matters for large
	// ones.
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for {
		if err := ctx.Err(); err != nil {
			return e.total, err
		}
		name, entry, err := walker.Next()
		if errors.Is(err, io.EOF) {
			e.cache.prune()
			return e.total, nil
		}
		if err != nil {
			return e.total, err
		}
		if err := e.write(name, entry); err != nil {
			return e.total, err
		}
	}
}

type exporter struct {
	ctx context.Context
	st  *filesystem.Storage
	// dirs are the directories along the walker's current path, each open as a
	// root, the export's own first. An entry is made in its parent's root under its
	// base name, so no path of more than one component is ever resolved: the
	// parent is the directory the export made, by its descriptor.
	dirs   []openDir
	commit string
	lim    exportLimits
	total  int64
	files  int
	// kinds records what was written at each path. The tree walker gives a
	// directory before its entries, so an entry's parent is always here, and it is
	// the only writer of the directory: a parent that is not a directory written by
	// the export is a link or a file of the tree.
	kinds map[string]filemode.FileMode
	cache *exportCache // nil: none
}

func (e *exporter) unsafe(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsafeTree, fmt.Sprintf(format, args...))
}

func (e *exporter) write(name string, entry object.TreeEntry) error {
	// Tree entry names cannot contain "/" or be "." or "..", but a tree can be
	// written by hand (git hash-object --literally): refuse anything else.
	base := entry.Name
	if base == "" || base == "." || base == ".." || strings.ContainsAny(base, "/\x00") || path.Clean("/"+name) != "/"+name {
		return e.unsafe("commit %s holds the path %q, which is not a file name; rewrite the commit with git", e.commit, name)
	}
	if entry.Mode == filemode.Submodule {
		return nil
	}
	if e.files++; e.files > e.lim.maxFiles {
		return fmt.Errorf("%w: commit %s has more than %d files and directories, the limit of a build context", ErrContextTooLarge, e.commit, e.lim.maxFiles)
	}
	if parent := path.Dir(name); parent != "." {
		switch kind, ok := e.kinds[parent]; {
		case !ok:
			return e.unsafe("commit %s holds %q without its directory %q; rewrite the commit with git", e.commit, name, parent)
		case kind == filemode.Symlink:
			return e.unsafe("commit %s holds %q below %q, which is a symbolic link; bex never writes through a link of the repository, rewrite the commit with git", e.commit, name, parent)
		case kind != filemode.Dir:
			return e.unsafe("commit %s holds %q below %q, which is a file; rewrite the commit with git", e.commit, name, parent)
		}
	}
	// The walker goes depth first: the parent is on the stack, below the
	// directories of earlier entries that are done.
	parent := path.Dir(name)
	i := len(e.dirs) - 1
	for i > 0 && e.dirs[i].name != parent {
		i--
	}
	if e.dirs[i].name != parent {
		return e.unsafe("commit %s holds %q outside the order of its tree; rewrite the commit with git", e.commit, name)
	}
	e.closeDirs(i + 1)
	dir := e.dirs[i].root
	if _, dup := e.kinds[name]; dup {
		return e.unsafe("commit %s holds %q twice; rewrite the commit with git", e.commit, name)
	}
	e.kinds[name] = entry.Mode
	exists := func(err error) error {
		if errors.Is(err, os.ErrExist) {
			return e.unsafe("commit %s holds %q twice; rewrite the commit with git", e.commit, name)
		}
		return err
	}
	switch entry.Mode {
	case filemode.Dir:
		if err := dir.Mkdir(base, 0o755); err != nil {
			return exists(err)
		}
		sub, err := dir.OpenRoot(base)
		if err != nil {
			return err
		}
		e.dirs = append(e.dirs, openDir{name: name, root: sub})
		return nil
	case filemode.Symlink:
		blob, err := object.GetBlob(e.st, entry.Hash)
		if err != nil {
			return err
		}
		if blob.Size > maxLinkTarget {
			return e.unsafe("the link %q of commit %s is %d bytes long, more than a link can be", name, e.commit, blob.Size)
		}
		target, err := readBlob(blob)
		if err != nil {
			return err
		}
		if len(target) == 0 || strings.ContainsRune(string(target), 0) {
			return e.unsafe("the link %q of commit %s has no valid target; rewrite the commit with git", name, e.commit)
		}
		// The link is written, never resolved: Root.Symlink creates it as is, and
		// what it points to is BuildKit's to interpret inside the build's own file
		// system.
		return exists(dir.Symlink(string(target), base))
	case filemode.Regular, filemode.Executable, filemode.Deprecated:
		mode := os.FileMode(0o644)
		if entry.Mode == filemode.Executable {
			mode = 0o755
		}
		tooLarge := func(size int64) error {
			if e.total += size; e.total > e.lim.maxBytes {
				return fmt.Errorf("%w: the files of commit %s are more than the limit of %s", ErrContextTooLarge, e.commit, bytesize.Format(e.lim.maxBytes))
			}
			return nil
		}
		if cached, size := e.cache.open(entry.Hash); cached != nil {
			defer cached.Close()
			if err := tooLarge(size); err != nil {
				return err
			}
			if err := e.copyFile(cached, dir, base, mode); err != nil {
				return exists(err)
			}
			return dir.Chtimes(base, blobTime(entry.Hash), blobTime(entry.Hash))
		}
		blob, err := object.GetBlob(e.st, entry.Hash)
		if err != nil {
			return err
		}
		if err := tooLarge(blob.Size); err != nil {
			return err
		}
		if err := e.writeBlob(blob, dir, base, mode); err != nil {
			return exists(err)
		}
		if blob.Size < exportCacheMin {
			return nil
		}
		if e.cache != nil {
			if f, err := dir.Open(base); err == nil {
				e.cache.keep(entry.Hash, blob.Size, f)
				f.Close()
			}
		}
		return dir.Chtimes(base, blobTime(entry.Hash), blobTime(entry.Hash))
	default:
		return e.unsafe("%q of commit %s has the mode %o, which is none of git's; rewrite the commit with git", name, e.commit, uint32(entry.Mode))
	}
}

type openDir struct {
	name string // path in the tree; "." for the export's root
	root *os.Root
}

// closeDirs closes the directories from the nth on (the first is the caller's).
func (e *exporter) closeDirs(n int) {
	for _, d := range e.dirs[n:] {
		d.root.Close()
	}
	e.dirs = e.dirs[:n]
}

func readBlob(b *object.Blob) ([]byte, error) {
	r, err := b.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, maxLinkTarget+1))
}

// writeBlob creates name (O_EXCL: an existing entry, a link included, is never
// opened) and copies the blob into it, checking ctx between chunks.
func (e *exporter) writeBlob(b *object.Blob, dir *os.Root, name string, mode os.FileMode) error {
	r, err := b.Reader()
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, ctxReader{e.ctx, io.LimitReader(r, b.Size)}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// copyFile creates name (O_EXCL, as writeBlob) with the content of src, a file
// of the export cache: in the kernel, without reading it into the process.
func (e *exporter) copyFile(src *os.File, dir *os.Root, name string, mode os.FileMode) error {
	if err := e.ctx.Err(); err != nil {
		return err
	}
	f, err := dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(src); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ctxReader stops a copy once ctx ends: a large blob is read in chunks of io.Copy's
// buffer, and each one checks.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
