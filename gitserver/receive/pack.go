package receive

import (
	"bufio"

	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/go-git/go-git/v5/plumbing/storer"
)

// ErrPackTooLarge is returned when a pushed pack exceeds the configured limit.
var ErrPackTooLarge = errors.New("pack too large")

// Pack describes a stored pack.
type Pack struct {
	// Name is the pack's file name without extension ("pack-<sha1>"); empty when the
	// push carried no objects.
	Name string
	// Objects is the number of objects the client sent.
	Objects int
	// Completed is the number of delta bases taken from the repository to complete a
	// thin pack.
	Completed int
	// Bytes is the size of the pack as received.
	Bytes int64
}

// StorePack reads one pack from in, stores it in the repository and checks every
// object it adds: git's fsck rules, the size limit, and that it refers only to
// objects the repository now has. It reads exactly the pack, so the caller can keep
// using the stream; it reads the whole pack even when it will refuse it, so that
// the pusher gets the refusal and not a broken pipe.
//
// Steps, each safe to interrupt (only renames make files visible):
//  1. stream the pack into objects/pack/tmp_pack_*, checking its structure, the
//     size each entry declares (before inflating it) and the checksum as it
//     arrives; whole objects are hashed as they stream, commits, trees and tags
//     checked with fsck;
//  2. complete a thin pack: append the bases that the repository has, as whole
//     objects, and rewrite the object count and the trailing checksum, as
//     `git index-pack --fix-thin` does;
//  3. resolve the deltas from the file, depth first, each rebuilt, hashed and
//     checked; write pack-<sha1>.pack and .idx;
//  4. check connectivity of the new objects.
//
// Memory is bounded by the object limit: an object over it is never held, only
// streamed through a hash, and a delta is applied holding its base and result.
//
// A refusal is an *fsck.Error, a *TooLargeError, ErrPackTooLarge or a sentence.
func (r *Repo) StorePack(ctx context.Context, in io.Reader, lim Limits) (*Pack, error) {
	packDir := filepath.Join(r.Dir, "objects", "pack")
	if err := os.MkdirAll(packDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(packDir, "tmp_pack_")
	if err != nil {
		return nil, err
	}
	tmpName := f.Name()
	stored := false
	defer func() {
		f.Close()
		if !stored {
			os.Remove(tmpName)
		}
	}()

	// 1. Receive.
	lr := &limitedReader{r: in, left: lim.MaxPackBytes, limited: lim.MaxPackBytes > 0}
	if lim.MaxObjectBytes <= 0 {
		lim.MaxObjectBytes = 1 << 30
	}
	if lim.MaxObjects <= 0 {
		lim.MaxObjects = DefaultMaxObjects
	}
	st := r.storage()
	has := func(h plumbing.Hash) bool { return st.HasEncodedObject(h) == nil }
	ix := newIndexer(f, lim.MaxObjectBytes, uint32(min(lim.MaxObjects, MaxObjectsLimit)), has)
	defer ix.close()
	count, size, err := ix.receive(ctx, &ctxReader{ctx: ctx, r: lr})
	if err != nil {
		return nil, err
	}
	p := &Pack{Objects: int(count), Bytes: size}
	if count == 0 {
		return p, nil
	}

	// 2. Complete a thin pack. A REF_DELTA base that the repository holds was left
	// out by the client on purpose; one it does not hold must be in the pack.
	var external []plumbing.Hash
	for _, h := range ix.missingBases() {
		if has(h) {
			external = append(external, h)
		}
	}
	checksum := plumbing.Hash{}
	if _, err := f.ReadAt(checksum[:], size-20); err != nil {
		return nil, err
	}
	if len(external) > 0 {
		if checksum, err = ix.appendBases(size, count, external, st); err != nil {
			return nil, fmt.Errorf("completing thin pack: %w", err)
		}
		p.Completed = len(external)
	}

	// 3. Resolve.
	if err := ix.resolve(ctx); err != nil {
		return nil, err
	}
	if ix.fsckErr != nil {
		return nil, ix.fsckErr
	}
	if ix.firstBig >= 0 {
		return nil, ix.tooLarge(lim.Tips)
	}

	// 4. Connectivity, before anything becomes visible.
	if err := ix.sortByID(); err != nil {
		return nil, err
	}
	if err := ix.checkConnected(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	for _, h := range lim.Tips {
		if i, ok := ix.lookup(h[:]); ok {
			if r.stored == nil {
				r.stored = map[plumbing.Hash]plumbing.ObjectType{}
			}
			r.stored[h] = plumbing.ObjectType(ix.entry(i).typ)
		}
	}
	r.mu.Unlock()
	if err := f.Sync(); err != nil {
		return nil, err
	}
	p.Name = "pack-" + checksum.String()
	packPath := filepath.Join(packDir, p.Name+".pack")
	idxPath := filepath.Join(packDir, p.Name+".idx")
	if _, err := os.Stat(idxPath); err == nil {
		return p, nil // the same pack is already stored: a retried push
	}
	if err := ix.writeIndex(idxPath+".tmp", checksum); err != nil {
		return nil, err
	}
	// The pack goes into place before its index: go-git and git find packs through
	// their .idx, so a pack is visible only once both are there.
	if err := os.Rename(tmpName, packPath); err != nil {
		os.Remove(idxPath + ".tmp")
		return nil, err
	}
	stored = true
	if err := os.Rename(idxPath+".tmp", idxPath); err != nil {
		os.Remove(packPath)
		return nil, err
	}
	syncDir(packDir)
	return p, nil
}

// appendBases replaces the trailer of the pack (size bytes, count objects) with the
// given objects from st, then writes the new count and checksum, which it returns.
func (ix *indexer) appendBases(size int64, count uint32, bases []plumbing.Hash, st storer.EncodedObjectStorer) (plumbing.Hash, error) {
	f := ix.f
	if err := f.Truncate(size - 20); err != nil {
		return plumbing.ZeroHash, err
	}
	off := size - 20
	for _, h := range bases {
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if ix.over(obj.Size()) {
			return plumbing.ZeroHash, &TooLargeError{ID: h, Size: obj.Size(), Limit: ix.limit}
		}
		crc := crc32.NewIEEE()
		cw := &countingWriter{w: io.MultiWriter(io.NewOffsetWriter(f, off), crc)}
		bw := bufio.NewWriterSize(cw, 256<<10)
		hdrLen, err := writeWholeObject(bw, obj)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if err := bw.Flush(); err != nil {
			return plumbing.ZeroHash, err
		}
		e := entry{off: off, hdrLen: uint8(hdrLen), size: obj.Size(), kind: int8(obj.Type()), typ: int8(obj.Type()),
			id: h, known: true, crc: crc.Sum32(), base: noBase}
		off += cw.n
		if err := ix.add(&e, plumbing.ZeroHash); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	ix.end = off
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], count+uint32(len(bases)))
	if _, err := f.WriteAt(n[:], 8); err != nil {
		return plumbing.ZeroHash, err
	}
	sum := sha1.New()
	if _, err := io.Copy(sum, bufio.NewReaderSize(io.NewSectionReader(f, 0, off), 1<<20)); err != nil {
		return plumbing.ZeroHash, err
	}
	var h plumbing.Hash
	copy(h[:], sum.Sum(nil))
	if _, err := f.WriteAt(h[:], off); err != nil {
		return plumbing.ZeroHash, err
	}
	return h, nil
}

// writeWholeObject writes obj as a non-delta pack entry: the type and size header,
// then the zlib-compressed content.
func writeWholeObject(w io.Writer, obj plumbing.EncodedObject) (int, error) {
	size := obj.Size()
	hdr := []byte{byte(obj.Type())<<4 | byte(size&0x0f)}
	size >>= 4
	for size > 0 {
		hdr[len(hdr)-1] |= 0x80
		hdr = append(hdr, byte(size&0x7f))
		size >>= 7
	}
	if _, err := w.Write(hdr); err != nil {
		return 0, err
	}
	rd, err := obj.Reader()
	if err != nil {
		return 0, err
	}
	defer rd.Close()
	zw := zlib.NewWriter(w)
	if _, err := io.Copy(zw, rd); err != nil {
		return 0, err
	}
	return len(hdr), zw.Close()
}

// CheckCommand checks a command against the stored objects: a branch must point at a
// commit, a tag at an object, both present.
func (r *Repo) CheckCommand(cmd Command) error {
	if cmd.IsDelete() {
		return nil
	}
	r.mu.Lock()
	t, ok := r.stored[cmd.New]
	r.mu.Unlock()
	if !ok {
		obj, err := r.storage().EncodedObject(plumbing.AnyObject, cmd.New)
		if err != nil {
			return fmt.Errorf("object %s is missing", cmd.New)
		}
		t = obj.Type()
	}
	if cmd.Name.IsBranch() && t != plumbing.CommitObject {
		return fmt.Errorf("%s would point at a %s, not a commit", cmd.Name.Short(), t)
	}
	return nil
}

type limitedReader struct {
	r       io.Reader
	left    int64
	limited bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.limited {
		if l.left <= 0 {
			return 0, ErrPackTooLarge
		}
		if int64(len(p)) > l.left {
			p = p[:l.left]
		}
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ctxReader stops reading once ctx ends (the pusher went away, the server stops).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
