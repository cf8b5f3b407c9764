package receive

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
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

// StorePack reads one pack from in, stores it in the repository and checks that
// every object it adds refers only to objects the repository now has. It reads
// exactly the pack, so the caller can keep using the stream.
//
// Steps, each safe to interrupt (only renames make files visible):
//  1. stream the pack into objects/pack/tmp_pack_*, checking its structure and
//     checksum as it arrives and noting the bases of REF_DELTA objects;
//  2. complete a thin pack: append the bases that the repository has, as whole
//     objects, and rewrite the object count and the trailing checksum, as
//     `git index-pack --fix-thin` does;
//  3. index it with go-git's parser and write pack-<sha1>.pack and .idx;
//  4. check connectivity of the new objects.
//
// maxBytes bounds the received size (0: no bound).
func (r *Repo) StorePack(ctx context.Context, in io.Reader, maxBytes int64) (*Pack, error) {
	packDir := filepath.Join(r.Dir, "objects", "pack")
	if err := os.MkdirAll(packDir, 0o750); err != nil {
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
	lr := &limitedReader{r: in, left: maxBytes, limited: maxBytes > 0}
	bw := bufio.NewWriterSize(f, 1<<20)
	counter := &countingWriter{w: bw}
	sc := packfile.NewScanner(io.TeeReader(&ctxReader{ctx: ctx, r: lr}, counter))
	_, count, err := sc.Header()
	if err != nil {
		return nil, fmt.Errorf("reading pack header: %w", err)
	}
	refBases := map[plumbing.Hash]struct{}{}
	for i := uint32(0); i < count; i++ {
		oh, err := sc.NextObjectHeader()
		if err != nil {
			return nil, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		if oh.Type == plumbing.REFDeltaObject {
			refBases[oh.Reference] = struct{}{}
		}
		if _, _, err := sc.NextObject(io.Discard); err != nil {
			return nil, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
	}
	if _, err := sc.Checksum(); err != nil {
		return nil, fmt.Errorf("reading pack trailer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	p := &Pack{Objects: int(count), Bytes: counter.n}
	if count == 0 {
		return p, nil
	}

	// 2. Complete a thin pack. A REF_DELTA base that the repository holds was left
	// out by the client on purpose; one it does not hold must be in the pack.
	st := r.storage()
	var external []plumbing.Hash
	for h := range refBases {
		if st.HasEncodedObject(h) == nil {
			external = append(external, h)
		}
	}
	if len(external) > 0 {
		if err := appendBases(f, counter.n, count, external, st); err != nil {
			return nil, fmt.Errorf("completing thin pack: %w", err)
		}
		p.Completed = len(external)
	}

	// 3. Index.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	idxw := &typeRecorder{Writer: new(idxfile.Writer), types: map[plumbing.Hash]plumbing.ObjectType{}}
	parser, err := packfile.NewParser(packfile.NewScanner(f), idxw)
	if err != nil {
		return nil, err
	}
	checksum, err := parser.Parse()
	if err != nil {
		if errors.Is(err, packfile.ErrReferenceDeltaNotFound) {
			return nil, errors.New("the pack refers to objects this repository does not have: fetch, rebase and push again")
		}
		return nil, fmt.Errorf("indexing pack: %w", err)
	}
	idx, err := idxw.Index()
	if err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	p.Name = "pack-" + checksum.String()
	packPath := filepath.Join(packDir, p.Name+".pack")
	idxPath := filepath.Join(packDir, p.Name+".idx")
	if _, err := os.Stat(idxPath); err == nil {
		// The same pack is already stored: a retried push.
		return p, r.checkConnected(packPath, idx, idxw.types)
	}
	if err := writeIndex(idxPath, idx); err != nil {
		return nil, err
	}
	// The pack goes into place before its index: go-git and git find packs through
	// their .idx, so a pack is visible only once both are there.
	if err := os.Rename(tmpName, packPath); err != nil {
		os.Remove(idxPath)
		return nil, err
	}
	stored = true
	if err := os.Rename(idxPath+".tmp", idxPath); err != nil {
		return nil, err
	}
	syncDir(packDir)

	// 4. Connectivity. A pack that fails it is removed again: nothing refers to it.
	if err := r.checkConnected(packPath, idx, idxw.types); err != nil {
		os.Remove(idxPath)
		os.Remove(packPath)
		return nil, err
	}
	return p, nil
}

// appendBases replaces the trailer of the pack in f (size bytes, count objects) with
// the given objects from st, then writes the new count and checksum.
func appendBases(f *os.File, size int64, count uint32, bases []plumbing.Hash, st storer.EncodedObjectStorer) error {
	if err := f.Truncate(size - 20); err != nil {
		return err
	}
	if _, err := f.Seek(size-20, io.SeekStart); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	for _, h := range bases {
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return err
		}
		if err := writeWholeObject(bw, obj); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], count+uint32(len(bases)))
	if _, err := f.WriteAt(n[:], 8); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := sha1.New()
	if _, err := io.Copy(h, bufio.NewReaderSize(f, 1<<20)); err != nil {
		return err
	}
	_, err := f.Write(h.Sum(nil))
	return err
}

// writeWholeObject writes obj as a non-delta pack entry: the type and size header,
// then the zlib-compressed content.
func writeWholeObject(w io.Writer, obj plumbing.EncodedObject) error {
	size := obj.Size()
	hdr := []byte{byte(obj.Type())<<4 | byte(size&0x0f)}
	size >>= 4
	for size > 0 {
		hdr[len(hdr)-1] |= 0x80
		hdr = append(hdr, byte(size&0x7f))
		size >>= 7
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	rd, err := obj.Reader()
	if err != nil {
		return err
	}
	defer rd.Close()
	zw := zlib.NewWriter(w)
	if _, err := io.Copy(zw, rd); err != nil {
		return err
	}
	return zw.Close()
}

func writeIndex(path string, idx *idxfile.MemoryIndex) error {
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	if _, err := idxfile.NewEncoder(bw).Encode(idx); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// typeRecorder builds the pack index and notes the type of each commit, tree and
// tag, the objects whose references the connectivity check follows.
type typeRecorder struct {
	*idxfile.Writer
	last  plumbing.ObjectType
	types map[plumbing.Hash]plumbing.ObjectType
}

func (r *typeRecorder) OnInflatedObjectHeader(t plumbing.ObjectType, size, pos int64) error {
	r.last = t
	return r.Writer.OnInflatedObjectHeader(t, size, pos)
}

func (r *typeRecorder) OnInflatedObjectContent(h plumbing.Hash, pos int64, crc uint32, content []byte) error {
	switch r.last {
	case plumbing.CommitObject, plumbing.TreeObject, plumbing.TagObject:
		r.types[h] = r.last
	}
	return r.Writer.OnInflatedObjectContent(h, pos, crc, content)
}

// checkConnected checks that every commit, tree and tag of the new pack refers only
// to objects that the pack or the repository holds. The repository was connected
// before the push, so this proves it still is, in time proportional to the push, not
// to the history. Objects are read straight from the new pack through its index,
// and existence is answered from that index first: go-git's storage looks for a
// loose object on disk before it looks in packs, a few system calls per question.
func (r *Repo) checkConnected(packPath string, idx *idxfile.MemoryIndex, types map[plumbing.Hash]plumbing.ObjectType) error {
	fs := osfs.New(filepath.Dir(packPath))
	file, err := fs.Open(filepath.Base(packPath))
	if err != nil {
		return err
	}
	pf := packfile.NewPackfile(idx, fs, file, 0)
	defer pf.Close()
	st := r.storage()
	known := map[plumbing.Hash]bool{}
	has := func(h plumbing.Hash) bool {
		if ok, _ := idx.Contains(h); ok {
			return true
		}
		ok, seen := known[h]
		if !seen {
			ok = st.HasEncodedObject(h) == nil
			known[h] = ok
		}
		return ok
	}
	for h, t := range types {
		obj, err := pf.Get(h)
		if err != nil {
			return fmt.Errorf("reading pushed %s %s: %w", t, h, err)
		}
		var refs []plumbing.Hash
		switch t {
		case plumbing.CommitObject:
			c, err := object.DecodeCommit(nil, obj)
			if err != nil {
				return fmt.Errorf("pushed commit %s: %w", h, err)
			}
			refs = append([]plumbing.Hash{c.TreeHash}, c.ParentHashes...)
		case plumbing.TreeObject:
			// Trees are most of the work in a long history: read the entries in
			// place rather than decoding each into an object.
			if refs, err = treeEntries(obj, refs); err != nil {
				return fmt.Errorf("pushed tree %s: %w", h, err)
			}
		case plumbing.TagObject:
			tag, err := object.DecodeTag(nil, obj)
			if err != nil {
				return fmt.Errorf("pushed tag %s: %w", h, err)
			}
			refs = []plumbing.Hash{tag.Target}
		}
		for _, ref := range refs {
			if !has(ref) {
				return fmt.Errorf("pushed object %s refers to %s, which is neither in the push nor in the repository", h, ref)
			}
		}
	}
	return nil
}

// treeEntries appends the object ids that tree obj refers to, submodule commits
// left out ("<octal mode> <name>\x00<20-byte id>", repeated).
func treeEntries(obj plumbing.EncodedObject, refs []plumbing.Hash) ([]plumbing.Hash, error) {
	rd, err := obj.Reader()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		return nil, err
	}
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		nul := bytes.IndexByte(data, 0)
		if sp <= 0 || nul < sp || len(data) < nul+21 {
			return nil, errors.New("malformed tree entry")
		}
		var h plumbing.Hash
		copy(h[:], data[nul+1:nul+21])
		if string(data[:sp]) != "160000" {
			refs = append(refs, h)
		}
		data = data[nul+21:]
	}
	return refs, nil
}

// CheckCommand checks a command against the stored objects: a branch must point at a
// commit, a tag at an object, both present.
func (r *Repo) CheckCommand(cmd Command) error {
	if cmd.IsDelete() {
		return nil
	}
	obj, err := r.storage().EncodedObject(plumbing.AnyObject, cmd.New)
	if err != nil {
		return fmt.Errorf("object %s is missing", cmd.New)
	}
	if cmd.Name.IsBranch() && obj.Type() != plumbing.CommitObject {
		return fmt.Errorf("%s would point at a %s, not a commit", cmd.Name.Short(), obj.Type())
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
