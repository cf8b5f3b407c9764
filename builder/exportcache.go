package builder

import (
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
)

// exportCacheDir is where, inside an app's bare repository, its exportCache
// lives: with the repository, so that it goes when the app's repository goes
// (apps:destroy), and no other app's build ever reads it. Git reads only its
// own names in a repository directory; a push writes only objects and refs.
const exportCacheDir = "bex-export-cache"

// exportCacheMin is the smallest file the cache keeps: below it, inflating the
// blob costs less than the cache's open, check and copy.
const exportCacheMin = 256 << 10

// exportCache keeps the large files of an app's last export, named by their
// blob id, so that the next export copies them (copy_file_range, in the
// kernel) instead of inflating them from the repository's pack again: a 6 MB
// binary committed with the app cost a warm push 100–250 ms of zlib for every
// one-line change beside it.
//
// A file is taken only when its content hashes to the blob id it is named by
// (git's blob hash, over the bytes the copy reads), so a file cut short by a
// crash, or changed on disk, is never exported: the blob is inflated and the
// file written again. New files are written under a temporary name and renamed.
// After an export, the files it did not use are removed, so the cache holds at
// most the large files of one commit.
type exportCache struct {
	dir  string
	used map[string]bool
}

// openExportCache is the cache in dir, made if missing; nil (no cache) when
// dir is "" or cannot be made.
func openExportCache(dir string) *exportCache {
	if dir == "" || os.MkdirAll(dir, 0o700) != nil {
		return nil
	}
	return &exportCache{dir: dir, used: map[string]bool{}}
}

// open returns the cached file of blob h and its size, verified against h; nil
// when there is none, or it does not hold the blob.
func (c *exportCache) open(h plumbing.Hash) (*os.File, int64) {
	if c == nil {
		return nil, 0
	}
	f, err := os.Open(filepath.Join(c.dir, h.String()))
	if err != nil {
		return nil, 0
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < exportCacheMin {
		f.Close()
		return nil, 0
	}
	sum := sha1.New()
	fmt.Fprintf(sum, "blob %d\x00", fi.Size())
	if n, err := io.Copy(sum, f); err != nil || n != fi.Size() || plumbing.Hash(sum.Sum(nil)) != h {
		f.Close()
		return nil, 0
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, 0
	}
	c.used[h.String()] = true
	return f, fi.Size()
}

// keep copies the exported file src (blob h, size bytes, open for reading at
// its start) into the cache. A failure only means the next export inflates the
// blob again.
func (c *exportCache) keep(h plumbing.Hash, size int64, src *os.File) {
	if c == nil || size < exportCacheMin {
		return
	}
	// Called when open found nothing it could use: what is there under the
	// name, if anything, is replaced.
	c.used[h.String()] = true
	tmp, err := os.CreateTemp(c.dir, ".tmp-")
	if err != nil {
		return
	}
	_, err = tmp.ReadFrom(src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(c.dir, h.String()))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}

// prune removes what the last export did not use: the large files of older
// commits, and temporary files an interrupted export left.
func (c *exportCache) prune() {
	if c == nil {
		return
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !c.used[e.Name()] {
			os.RemoveAll(filepath.Join(c.dir, e.Name()))
		}
	}
}

// blobTime is the modification time of an exported file of at least
// exportCacheMin bytes: a function of its blob id, so that the same content
// has the same time in every export of the app, and BuildKit's incremental
// send of the context (which skips a file whose size and time it has seen)
// sends a large file that did not change not again; a 6 MB binary took it
// 80 ms a build. Another content has another time (about 62 bits of its id, to the
// nanosecond, within 2001–2137), so a change is never skipped as the same
// file; finding another blob of the same size and time is a second preimage
// of 62 bits of SHA-1, and would only fool the app's own build (the context's
// cache is the app's: builder's SharedKey).
func blobTime(h plumbing.Hash) time.Time {
	v := binary.BigEndian.Uint64(h[:8]) >> 2
	return time.Unix(1_000_000_000+int64(v/1_000_000_000%(4_300_000_000)), int64(v%1_000_000_000)).UTC()
}
