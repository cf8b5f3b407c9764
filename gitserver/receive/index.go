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
	"hash"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"

	"github.com/go-git/go-git/v5/plumbing"
	githash "github.com/go-git/go-git/v5/plumbing/hash"

	"bex.co/bex/gitserver/receive/fsck"
)

// Pack entry types (git's pack format).
const (
	typeCommit   = 1
	typeTree     = 2
	typeBlob     = 3
	typeTag      = 4
	typeOfsDelta = 6
	typeRefDelta = 7
)

// maxChainDepth is git's own bound on delta chains (pack-objects' OE_DEPTH_BITS).
const maxChainDepth = 4095

// heldBudget bounds the resolved objects kept along a delta chain while its
// descendants are resolved; past it a base is dropped and rebuilt when needed.
const heldBudget = 32 << 20

// noBase is the base of a delta whose base is not known yet.
const noBase = ^uint32(0)

// entry is one object of the pack as indexed. The indexer keeps entries in a
// table of entrySize-byte records (see records): 46 bytes an object, whatever
// their number, where a struct, a map entry by id, children lists and go-git's
// index writer cost about ten times as much.
type entry struct {
	off    int64 // of the entry's header
	size   int64 // declared: a whole object's; a delta's result's (its own, for a delta over the limit)
	id     plumbing.Hash
	crc    uint32
	base   uint32 // a delta's base (an index), noBase until known
	kind   int8   // the entry's type in the pack
	typ    int8   // the object's type, once known
	hdrLen uint8  // of the entry's header: its zlib stream starts at off+hdrLen
	known  bool   // id and typ are set
	big    bool   // over the object limit: not resolved, refused
}

const entrySize = 46

func (e *entry) isDelta() bool  { return e.kind == typeOfsDelta || e.kind == typeRefDelta }
func (e *entry) dataOff() int64 { return e.off + int64(e.hdrLen) }

func (e *entry) put(b []byte) {
	copy(b[0:20], e.id[:])
	binary.LittleEndian.PutUint64(b[20:], uint64(e.off))
	binary.LittleEndian.PutUint64(b[28:], uint64(e.size))
	binary.LittleEndian.PutUint32(b[36:], e.crc)
	binary.LittleEndian.PutUint32(b[40:], e.base)
	f := byte(e.kind&7) | byte(e.typ&7)<<3
	if e.known {
		f |= 1 << 6
	}
	if e.big {
		f |= 1 << 7
	}
	b[44] = f
	b[45] = e.hdrLen
}

func getEntry(b []byte) (e entry) {
	copy(e.id[:], b[0:20])
	e.off = int64(binary.LittleEndian.Uint64(b[20:]))
	e.size = int64(binary.LittleEndian.Uint64(b[28:]))
	e.crc = binary.LittleEndian.Uint32(b[36:])
	e.base = binary.LittleEndian.Uint32(b[40:])
	e.kind, e.typ = int8(b[44]&7), int8(b[44]>>3&7)
	e.known, e.big = b[44]&(1<<6) != 0, b[44]&(1<<7) != 0
	e.hdrLen = b[45]
	return e
}

// Records of the other tables: a REF_DELTA (its base's id, its index, and
// whether a whole object of the pack has that id); an OFS_DELTA (its base's
// index, its own); an id; an index.
const (
	refSize = 25
	ofsSize = 8
	idSize  = 20
	ixSize  = 4
)

func u32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// indexer indexes one pack with bounded memory: whole objects are held only up to
// the object limit, and only commits, trees, tags and delta bases are held at all;
// what it keeps per object is in fixed-size records outside the heap (records).
type indexer struct {
	f          *os.File
	limit      int64  // per object; 0: none
	maxObjects uint32 // per pack; 0: none
	// has reports whether the repository (not the pack) holds an object.
	has   func(plumbing.Hash) bool
	count uint32 // the objects the pack's header announces
	end   int64  // where the last entry ends: the trailer

	entries *records // every object, in pack order (entrySize)
	// ofsKids are the OFS_DELTAs and refs the REF_DELTAs, sorted by base once the
	// pack is in: the deltas on an object are a range of each.
	ofsKids *records
	refs    *records
	// needed are the ids that new commits, trees and tags refer to, sorted and
	// deduplicated when the table reaches neededCap.
	needed    *records
	neededCap int
	neededErr error
	// seen is a direct-mapped cache of ids given to need, by their first bytes
	// (seenSlots of them, whatever the push): the versions of a tree name mostly
	// the same objects, so most of a push's references repeat one noted shortly
	// before. A hit skips the table, which holds that id already (or set it
	// aside: the repository has it); without it the table took a million ids for
	// a 2,000-commit push and its sorts cost more than the rest of the indexing.
	seen       *records
	seenMapped bool
	// byID are the indices of the known objects sorted by id, once all are known.
	byID *records

	firstBig int // index of the first entry over the limit, -1 if none
	held     int64
	// spare holds buffers of dropped contents for the next ones: large objects
	// then reuse memory instead of leaving garbage that the GC lets grow the heap.
	spare [][]byte
	// fsckErr is the first fsck finding; the pack is still read to its end, so
	// that the pusher gets the refusal rather than a broken pipe.
	fsckErr error

	// Reused from object to object, so that many small objects make little garbage.
	sum     hash.Hash // object ids
	obj     []byte    // a commit, tree or tag as it streams in
	copyBuf []byte
	raw     []byte        // a small entry's zlib stream, read at once
	rawR    bytes.Reader  // over raw
	fileBuf *bufio.Reader // a large entry's zlib stream
	zr      io.ReadCloser
	zbuf    *bufio.Reader // inflated bytes
}

func newIndexer(f *os.File, limit int64, maxObjects uint32, has func(plumbing.Hash) bool) *indexer {
	return &indexer{f: f, limit: limit, maxObjects: maxObjects, has: has, firstBig: -1,
		entries: newRecords(entrySize), ofsKids: newRecords(ofsSize), refs: newRecords(refSize),
		needed: newRecords(idSize), byID: newRecords(ixSize), seen: newRecords(idSize),
		sum: githash.New(githash.CryptoType), copyBuf: make([]byte, 32<<10)}
}

// close gives back the tables' memory.
func (ix *indexer) close() {
	for _, r := range []*records{ix.entries, ix.ofsKids, ix.refs, ix.needed, ix.byID, ix.seen} {
		r.free()
	}
}

func (ix *indexer) entry(i int) entry        { return getEntry(ix.entries.at(i)) }
func (ix *indexer) setEntry(i int, e *entry) { e.put(ix.entries.at(i)) }
func (ix *indexer) idAt(i int) []byte        { return ix.entries.at(i)[0:20] }
func (ix *indexer) offAt(i int) int64 {
	return int64(binary.LittleEndian.Uint64(ix.entries.at(i)[20:]))
}

// atOffset finds the entry at a pack offset: entries are in pack order, so a
// search takes the place of a map of every offset.
func (ix *indexer) atOffset(off int64) (int, bool) {
	i := sort.Search(ix.entries.len(), func(i int) bool { return ix.offAt(i) >= off })
	return i, i < ix.entries.len() && ix.offAt(i) == off
}

// endOf is where entry i's zlib stream ends: at the next entry, or the trailer.
func (ix *indexer) endOf(i int) int64 {
	if i+1 < ix.entries.len() {
		return ix.offAt(i + 1)
	}
	return ix.end
}

func (ix *indexer) over(n int64) bool { return ix.limit > 0 && n > ix.limit }

// hasher starts the id of an object of type t and size bytes.
func (ix *indexer) hasher(t int8, size int64) hash.Hash {
	ix.sum.Reset()
	var hdr [32]byte
	b := hdr[:0]
	switch t {
	case typeCommit:
		b = append(b, "commit"...)
	case typeTree:
		b = append(b, "tree"...)
	case typeBlob:
		b = append(b, "blob"...)
	case typeTag:
		b = append(b, "tag"...)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, size, 10)
	b = append(b, 0)
	ix.sum.Write(b)
	return ix.sum
}

func (ix *indexer) sumID() (id plumbing.Hash) {
	ix.sum.Sum(id[:0])
	return id
}

// streamReader reads the pack from the network, writes every byte it hands out
// to the file, and hashes it into the pack checksum and the current entry's CRC.
// It is an io.ByteReader, so zlib reads exactly its stream and no further.
type streamReader struct {
	src     io.Reader
	buf     []byte
	r, w    int
	mark    int
	base    int64 // stream offset of buf[0]
	out     *bufio.Writer
	sum     hash.Hash
	crc     hash.Hash32
	hashing bool
}

func (s *streamReader) flush() error {
	if s.r > s.mark {
		chunk := s.buf[s.mark:s.r]
		if _, err := s.out.Write(chunk); err != nil {
			return err
		}
		if s.hashing {
			s.sum.Write(chunk)
		}
		s.crc.Write(chunk)
	}
	s.mark = s.r
	return nil
}

func (s *streamReader) fill() error {
	if err := s.flush(); err != nil {
		return err
	}
	s.base += int64(s.r)
	s.r, s.w, s.mark = 0, 0, 0
	for {
		n, err := s.src.Read(s.buf)
		if n > 0 {
			s.w = n
			return nil
		}
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
}

func (s *streamReader) ReadByte() (byte, error) {
	if s.r == s.w {
		if err := s.fill(); err != nil {
			return 0, err
		}
	}
	b := s.buf[s.r]
	s.r++
	return b, nil
}

func (s *streamReader) Read(p []byte) (int, error) {
	if s.r == s.w {
		if err := s.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.buf[s.r:s.w])
	s.r += n
	return n, nil
}

func (s *streamReader) offset() int64 { return s.base + int64(s.r) }

// header is an entry's header as read in pass 1.
type header struct {
	kind    int8
	size    int64 // of the inflated data (of the delta itself, for a delta)
	baseOff int64 // an OFS_DELTA's base
	baseRef plumbing.Hash
}

// readHeader reads the header of the entry at off: its type and size, and a
// delta's base.
func readHeader(br io.ByteReader, off int64, e *header) error {
	c, err := br.ReadByte()
	if err != nil {
		return err
	}
	e.kind = int8(c>>4) & 7
	size := int64(c & 0x0f)
	shift := uint(4)
	for c&0x80 != 0 {
		if c, err = br.ReadByte(); err != nil {
			return err
		}
		if shift > 56 {
			return errors.New("object size header overflows")
		}
		size |= int64(c&0x7f) << shift
		shift += 7
	}
	if size < 0 {
		return errors.New("object size header overflows")
	}
	e.size = size
	switch e.kind {
	case typeCommit, typeTree, typeBlob, typeTag:
	case typeOfsDelta:
		c, err := br.ReadByte()
		if err != nil {
			return err
		}
		rel := int64(c & 0x7f)
		for c&0x80 != 0 {
			if c, err = br.ReadByte(); err != nil {
				return err
			}
			if rel > 1<<48 {
				return errors.New("delta base offset overflows")
			}
			rel = (rel+1)<<7 | int64(c&0x7f)
		}
		e.baseOff = off - rel
		if rel <= 0 || e.baseOff < 12 {
			return errors.New("delta base offset out of the pack")
		}
	case typeRefDelta:
		for i := range e.baseRef {
			if e.baseRef[i], err = br.ReadByte(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown object type %d", e.kind)
	}
	return nil
}

// deltaSizes reads the two sizes a delta starts with (base, then result).
func deltaSizes(br io.ByteReader) (base, result int64, err error) {
	read := func() (int64, error) {
		var n int64
		for shift := uint(0); ; shift += 7 {
			c, err := br.ReadByte()
			if err != nil {
				return 0, err
			}
			if shift > 56 {
				return 0, errors.New("delta size overflows")
			}
			n |= int64(c&0x7f) << shift
			if c&0x80 == 0 {
				return n, nil
			}
		}
	}
	if base, err = read(); err != nil {
		return
	}
	result, err = read()
	return
}

// inflateExact copies exactly size inflated bytes of zr to w (through buf) and
// checks that the stream ends there (its checksum included). More bytes than
// declared is an error as soon as one is seen, so a zlib bomb is never inflated
// past its header's word.
func inflateExact(zr io.Reader, w io.Writer, size int64, buf []byte) error {
	n, err := io.CopyBuffer(w, io.LimitReader(zr, size), buf)
	if err != nil {
		return err
	}
	if n < size {
		return fmt.Errorf("inflates to %d bytes, not the %d its header declares", n, size)
	}
	var one [1]byte
	for {
		m, err := zr.Read(one[:])
		if m > 0 {
			return fmt.Errorf("inflates to more than the %d bytes its header declares", size)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// collector keeps what is written to it.
type collector struct{ b []byte }

func (c *collector) Write(p []byte) (int, error) { c.b = append(c.b, p...); return len(p), nil }

// deltaHead parses the two sizes at the start of a delta as it streams by.
type deltaHead struct {
	vals  [2]int64
	n     int
	shift uint
	bad   bool
}

func (d *deltaHead) Write(p []byte) (int, error) {
	for _, c := range p {
		if d.n == 2 {
			break
		}
		if d.shift > 56 {
			d.bad = true
			d.n = 2
			break
		}
		d.vals[d.n] |= int64(c&0x7f) << d.shift
		d.shift += 7
		if c&0x80 == 0 {
			d.n++
			d.shift = 0
		}
	}
	return len(p), nil
}

// receive is pass 1: it reads the pack from in into the file, checks its
// structure, sizes and checksum, hashes and checks every whole object, and notes
// the deltas. It returns the object count and the pack's size. A pack announcing
// more objects than maxObjects is refused from its header, before any object.
func (ix *indexer) receive(ctx context.Context, in io.Reader) (uint32, int64, error) {
	bw := bufio.NewWriterSize(ix.f, 1<<20)
	s := &streamReader{src: in, buf: make([]byte, 64<<10), out: bw, sum: sha1.New(), crc: crc32.NewIEEE(), hashing: true}
	var hdr [12]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		return 0, 0, fmt.Errorf("reading pack header: %w", err)
	}
	if string(hdr[:4]) != "PACK" {
		return 0, 0, errors.New("reading pack header: not a pack")
	}
	if v := binary.BigEndian.Uint32(hdr[4:8]); v != 2 && v != 3 {
		return 0, 0, fmt.Errorf("reading pack header: unsupported version %d", v)
	}
	count := binary.BigEndian.Uint32(hdr[8:12])
	if ix.maxObjects > 0 && count > ix.maxObjects {
		return 0, 0, &TooManyObjectsError{Objects: int64(count), Limit: int64(ix.maxObjects)}
	}
	ix.count = count
	// Room for twice the objects' ids before the first compaction: most objects
	// are referred to once, so a push is usually compacted only at its end.
	ix.neededCap = 2*int(count) + 4096
	var zr io.ReadCloser
	for i := uint32(0); i < count; i++ {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if err := s.flush(); err != nil {
			return 0, 0, err
		}
		s.crc.Reset()
		var h header
		e := entry{off: s.offset(), base: noBase}
		if err := readHeader(s, e.off, &h); err != nil {
			return 0, 0, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		e.kind = h.kind
		e.hdrLen = uint8(s.offset() - e.off)
		if e.kind == typeOfsDelta {
			b, ok := ix.atOffset(h.baseOff)
			if !ok {
				return 0, 0, fmt.Errorf("reading object %d of %d: its delta base is not an object of the pack", i+1, count)
			}
			e.base = uint32(b)
		}
		var err error
		if zr == nil {
			zr, err = zlib.NewReader(s)
		} else {
			err = zr.(zlib.Resetter).Reset(s, nil)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		if err := ix.inflateEntry(zr, &e, h.size); err != nil {
			return 0, 0, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		if ix.neededErr != nil {
			return 0, 0, ix.neededErr
		}
		if err := s.flush(); err != nil {
			return 0, 0, err
		}
		e.crc = s.crc.Sum32()
		if err := ix.add(&e, h.baseRef); err != nil {
			return 0, 0, err
		}
	}
	if err := s.flush(); err != nil {
		return 0, 0, err
	}
	ix.end = s.offset()
	s.hashing = false
	want := s.sum.Sum(nil)
	var trailer [20]byte
	if _, err := io.ReadFull(s, trailer[:]); err != nil {
		return 0, 0, fmt.Errorf("reading pack trailer: %w", err)
	}
	if err := s.flush(); err != nil {
		return 0, 0, err
	}
	if !bytes.Equal(want, trailer[:]) {
		return 0, 0, errors.New("reading pack trailer: the pack's checksum does not match its content")
	}
	if err := bw.Flush(); err != nil {
		return 0, 0, err
	}
	ix.sortDeltas()
	return count, s.offset(), nil
}

// inflateEntry inflates one entry of size bytes as it arrives: a whole object is
// hashed (and checked, for a commit, tree or tag); a delta is only measured.
func (ix *indexer) inflateEntry(zr io.Reader, e *entry, size int64) error {
	e.size = size
	if e.isDelta() {
		if ix.over(size) {
			e.big = true
			return inflateExact(zr, io.Discard, size, ix.copyBuf)
		}
		var dh deltaHead
		if err := inflateExact(zr, &dh, size, ix.copyBuf); err != nil {
			return err
		}
		if dh.n < 2 || dh.bad {
			return errors.New("malformed delta header")
		}
		e.size = dh.vals[1]
		if ix.over(e.size) {
			e.big = true
		}
		return nil
	}
	e.typ = e.kind
	h := ix.hasher(e.typ, size)
	if ix.over(size) || e.typ == typeBlob {
		// Over the limit: streamed to learn its id (to name its path), never held.
		e.big = ix.over(size)
		if err := inflateExact(zr, h, size, ix.copyBuf); err != nil {
			return err
		}
		e.id, e.known = ix.sumID(), true
		return nil
	}
	c := &collector{b: ix.obj[:0]}
	if err := inflateExact(zr, io.MultiWriter(h, c), size, ix.copyBuf); err != nil {
		return err
	}
	// The buffer is kept for the next object unless it grew large.
	if cap(c.b) <= 1<<20 {
		ix.obj = c.b
	} else {
		ix.obj = nil
	}
	e.id, e.known = ix.sumID(), true
	return ix.check(e.typ, e.id, c.b)
}

// add records an entry.
func (ix *indexer) add(e *entry, baseRef plumbing.Hash) error {
	i := ix.entries.len()
	if uint64(i) >= uint64(noBase) {
		return errors.New("the pack holds too many objects")
	}
	b, err := ix.entries.add()
	if err != nil {
		return err
	}
	e.put(b)
	if e.big && ix.firstBig < 0 {
		ix.firstBig = i
	}
	switch e.kind {
	case typeOfsDelta:
		r, err := ix.ofsKids.add()
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(r[0:], e.base)
		binary.LittleEndian.PutUint32(r[4:], uint32(i))
	case typeRefDelta:
		r, err := ix.refs.add()
		if err != nil {
			return err
		}
		copy(r[0:20], baseRef[:])
		binary.LittleEndian.PutUint32(r[20:], uint32(i))
		r[24] = 0
	}
	return nil
}

// sortDeltas sorts the deltas by base (ties in pack order), so that the deltas on
// an object are a range found by search, and marks the REF_DELTAs whose base is
// a whole object of the pack.
func (ix *indexer) sortDeltas() {
	ix.ofsKids.sortBy(func(a, b []byte) bool {
		if x, y := u32(a), u32(b); x != y {
			return x < y
		}
		return u32(a[4:]) < u32(b[4:])
	})
	if ix.refs.len() == 0 {
		return
	}
	ix.refs.sortBy(func(a, b []byte) bool {
		if c := bytes.Compare(a[:20], b[:20]); c != 0 {
			return c < 0
		}
		return u32(a[20:]) < u32(b[20:])
	})
	for i := 0; i < ix.entries.len(); i++ {
		e := ix.entries.at(i)
		if e[44]&(1<<6) == 0 { // not known: a delta
			continue
		}
		for k := ix.refsOn(e[0:20]); k < ix.refs.len() && bytes.Equal(ix.refs.at(k)[:20], e[0:20]); k++ {
			ix.refs.at(k)[24] = 1
		}
	}
}

// refsOn is the first of the sorted REF_DELTAs whose base is id (or after).
func (ix *indexer) refsOn(id []byte) int {
	return ix.refs.search(func(r []byte) bool { return bytes.Compare(r[:20], id) >= 0 })
}

// missingBases are the REF_DELTAs' bases that no whole object of the pack is:
// in the repository when the pack is thin, or deltas of the pack, or missing.
func (ix *indexer) missingBases() []plumbing.Hash {
	var out []plumbing.Hash
	for k := 0; k < ix.refs.len(); k++ {
		r := ix.refs.at(k)
		if r[24] != 0 || (len(out) > 0 && bytes.Equal(out[len(out)-1][:], r[:20])) {
			continue
		}
		out = append(out, plumbing.Hash(r[:20]))
	}
	return out
}

// check runs fsck on a commit, tree or tag and notes what it refers to.
func (ix *indexer) check(t int8, id plumbing.Hash, data []byte) error {
	if ix.fsckErr != nil {
		return nil
	}
	if err := ix.checkObject(t, id, data); err != nil {
		var fe *fsck.Error
		if !errors.As(err, &fe) {
			return err
		}
		ix.fsckErr = err
	}
	return ix.neededErr
}

func (ix *indexer) checkObject(t int8, id plumbing.Hash, data []byte) error {
	hexID := id.String()
	switch t {
	case typeCommit:
		refs, err := fsck.CheckCommit(hexID, data)
		if err != nil {
			return err
		}
		ix.need(refs.Tree[:])
		for _, p := range refs.Parents {
			ix.need(p[:])
		}
	case typeTree:
		return fsck.CheckTree(hexID, data, func(e fsck.Entry) {
			if !e.IsGitlink() {
				ix.need(e.ID[:])
			}
		})
	case typeTag:
		refs, err := fsck.CheckTag(hexID, data)
		if err != nil {
			return err
		}
		ix.need(refs.Object[:])
	}
	return nil
}

// need notes an id that a new object refers to. When the table is full it is
// sorted and deduplicated; if it then holds more ids than the pack has objects,
// those the repository has are set aside (they are there), and if more remain,
// the push cannot hold them all: it is refused (neededErr).
func (ix *indexer) need(id []byte) {
	if ix.neededErr != nil {
		return
	}
	var slot []byte
	if *(*[20]byte)(id) != ([20]byte{}) { // an empty slot holds zeros
		if !ix.seenMapped {
			// Mapped on first use; without it (no memory), the table alone does.
			ix.seenMapped = true
			if err := ix.seen.grow(seenSlots * idSize); err == nil {
				ix.seen.truncate(seenSlots)
			}
		}
		if ix.seen.len() == seenSlots {
			slot = ix.seen.at(int(binary.LittleEndian.Uint32(id) % seenSlots))
			if sameID(slot, id) {
				return
			}
		}
	}
	if ix.needed.len() >= ix.neededCap {
		ix.compactNeeded(true)
		if ix.neededErr != nil {
			return
		}
	}
	r, err := ix.needed.add()
	if err != nil {
		ix.neededErr = err
		return
	}
	copy(r, id)
	copy(slot, id)
}

// sameID is bytes.Equal for two ids, in three loads each.
func sameID(a, b []byte) bool {
	le := binary.LittleEndian
	return le.Uint64(a) == le.Uint64(b) && le.Uint64(a[8:]) == le.Uint64(b[8:]) && le.Uint32(a[16:]) == le.Uint32(b[16:])
}

// seenSlots is the size of the need cache: 1.25 MiB, whatever the push.
const seenSlots = 1 << 16

func (ix *indexer) compactNeeded(filter bool) {
	ix.needed.sortBy(func(a, b []byte) bool { return bytes.Compare(a, b) < 0 })
	ix.needed.dedup()
	if !filter || ix.needed.len() <= int(ix.count) {
		return
	}
	w := 0
	for i := 0; i < ix.needed.len(); i++ {
		if !ix.has(plumbing.Hash(ix.needed.at(i))) {
			copy(ix.needed.at(w), ix.needed.at(i))
			w++
		}
	}
	ix.needed.truncate(w)
	if w > int(ix.count) {
		ix.neededErr = fmt.Errorf("the pushed objects refer to %d objects that the repository does not have, more than the %d the push holds", w, ix.count)
	}
}

// take returns a buffer of length 0 and capacity at least n.
func (ix *indexer) take(n int64) []byte {
	for k, b := range ix.spare {
		if int64(cap(b)) >= n {
			ix.spare = append(ix.spare[:k], ix.spare[k+1:]...)
			return b[:0]
		}
	}
	return make([]byte, 0, n)
}

// give hands back a buffer that nothing refers to any more.
func (ix *indexer) give(b []byte) {
	if cap(b) < 1<<20 {
		return
	}
	if len(ix.spare) >= 2 {
		// Keep the largest two.
		small := 0
		for k := range ix.spare {
			if cap(ix.spare[k]) < cap(ix.spare[small]) {
				small = k
			}
		}
		if cap(ix.spare[small]) >= cap(b) {
			return
		}
		ix.spare[small] = b
		return
	}
	ix.spare = append(ix.spare, b)
}

// smallEntry is the size of a zlib stream read from the file at once.
const smallEntry = 64 << 10

// inflater opens the zlib stream of entry i (e) in the file. The reader is the
// indexer's own: it serves one entry at a time.
func (ix *indexer) inflater(i int, e *entry) (*bufio.Reader, error) {
	var src io.Reader
	if n := ix.endOf(i) - e.dataOff(); n > 0 && n <= smallEntry {
		if cap(ix.raw) < int(n) {
			ix.raw = make([]byte, smallEntry)
		}
		ix.raw = ix.raw[:n]
		if _, err := ix.f.ReadAt(ix.raw, e.dataOff()); err != nil {
			return nil, err
		}
		ix.rawR.Reset(ix.raw)
		src = &ix.rawR
	} else {
		sr := io.NewSectionReader(ix.f, e.dataOff(), 1<<62)
		if ix.fileBuf == nil {
			ix.fileBuf = bufio.NewReaderSize(sr, 32<<10)
		} else {
			ix.fileBuf.Reset(sr)
		}
		src = ix.fileBuf
	}
	if ix.zr == nil {
		zr, err := zlib.NewReader(src)
		if err != nil {
			return nil, err
		}
		ix.zr = zr
	} else if err := ix.zr.(zlib.Resetter).Reset(src, nil); err != nil {
		return nil, err
	}
	if ix.zbuf == nil {
		ix.zbuf = bufio.NewReaderSize(ix.zr, 32<<10)
	} else {
		ix.zbuf.Reset(ix.zr)
	}
	return ix.zbuf, nil
}

// readWhole inflates whole (non-delta) entry i from the file.
func (ix *indexer) readWhole(i int, e *entry) ([]byte, error) {
	br, err := ix.inflater(i, e)
	if err != nil {
		return nil, err
	}
	buf := ix.take(e.size)[:e.size]
	if _, err := io.ReadFull(br, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// applyDelta rebuilds delta entry i (e) on base, reading its instructions from
// the file as they are applied: only the base and the result are in memory.
func (ix *indexer) applyDelta(base []byte, i int, e *entry) ([]byte, error) {
	br, err := ix.inflater(i, e)
	if err != nil {
		return nil, err
	}
	baseSize, resultSize, err := deltaSizes(br)
	if err != nil {
		return nil, err
	}
	if baseSize != int64(len(base)) || resultSize != e.size {
		return nil, fmt.Errorf("delta at offset %d does not fit its base", e.off)
	}
	out := ix.take(resultSize)
	for {
		cmd, err := br.ReadByte()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch {
		case cmd&0x80 != 0:
			var off, n int64
			for i := uint(0); i < 4; i++ {
				if cmd&(1<<i) != 0 {
					c, err := br.ReadByte()
					if err != nil {
						return nil, err
					}
					off |= int64(c) << (8 * i)
				}
			}
			for i := uint(0); i < 3; i++ {
				if cmd&(0x10<<i) != 0 {
					c, err := br.ReadByte()
					if err != nil {
						return nil, err
					}
					n |= int64(c) << (8 * i)
				}
			}
			if n == 0 {
				n = 0x10000
			}
			if off+n > int64(len(base)) || int64(len(out))+n > resultSize {
				return nil, fmt.Errorf("delta at offset %d copies outside its base or result", e.off)
			}
			out = append(out, base[off:off+n]...)
		case cmd != 0:
			n := int(cmd)
			if int64(len(out)+n) > resultSize {
				return nil, fmt.Errorf("delta at offset %d writes past its result", e.off)
			}
			start := len(out)
			out = out[:start+n]
			if _, err := io.ReadFull(br, out[start:]); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("delta at offset %d has a reserved instruction", e.off)
		}
	}
	if int64(len(out)) != resultSize {
		return nil, fmt.Errorf("delta at offset %d yields %d bytes, not %d", e.off, len(out), resultSize)
	}
	return out, nil
}

// materialize rebuilds entry i's content from the whole object at the root of
// its chain, holding two objects at a time.
func (ix *indexer) materialize(i int) ([]byte, error) {
	chain := []int{i}
	for {
		e := ix.entry(chain[len(chain)-1])
		if !e.isDelta() {
			break
		}
		if len(chain) > maxChainDepth {
			return nil, errors.New("a delta chain is deeper than git allows")
		}
		if e.base == noBase {
			return nil, fmt.Errorf("the delta at offset %d has no base", e.off)
		}
		chain = append(chain, int(e.base))
	}
	root := chain[len(chain)-1]
	re := ix.entry(root)
	content, err := ix.readWhole(root, &re)
	if err != nil {
		return nil, err
	}
	for j := len(chain) - 2; j >= 0; j-- {
		e := ix.entry(chain[j])
		next, err := ix.applyDelta(content, chain[j], &e)
		if err != nil {
			return nil, err
		}
		ix.give(content)
		content = next
	}
	return content, nil
}

// kids are the deltas on an object: a range of the OFS_DELTAs and one of the
// REF_DELTAs (by its id, once known).
type kids struct{ ofsLo, ofsHi, refLo, refHi int }

func (k kids) len() int { return k.ofsHi - k.ofsLo + k.refHi - k.refLo }

func (ix *indexer) kidsOf(i int, e *entry) kids {
	var k kids
	k.ofsLo = ix.ofsKids.search(func(r []byte) bool { return u32(r) >= uint32(i) })
	k.ofsHi = ix.ofsKids.search(func(r []byte) bool { return u32(r) > uint32(i) })
	if e.known && ix.refs.len() > 0 {
		k.refLo = ix.refsOn(e.id[:])
		k.refHi = k.refLo
		for k.refHi < ix.refs.len() && bytes.Equal(ix.refs.at(k.refHi)[:20], e.id[:]) {
			k.refHi++
		}
	}
	return k
}

// kid is the index of the n-th delta of k.
func (ix *indexer) kid(k kids, n int) int {
	if n < k.ofsHi-k.ofsLo {
		return int(u32(ix.ofsKids.at(k.ofsLo + n)[4:]))
	}
	return int(u32(ix.refs.at(k.refLo + n - (k.ofsHi - k.ofsLo))[20:]))
}

// resolve is pass 2: every delta is rebuilt, hashed and checked, depth first
// from the whole objects, in pack order.
func (ix *indexer) resolve(ctx context.Context) error {
	for i := 0; i < ix.entries.len(); i++ {
		e := ix.entry(i)
		if e.isDelta() || e.big || ix.kidsOf(i, &e).len() == 0 {
			continue
		}
		if err := ix.walk(ctx, i, nil, 1); err != nil {
			return err
		}
	}
	if ix.firstBig >= 0 {
		// Refused for that object: the deltas on it are not resolved.
		return nil
	}
	for i := 0; i < ix.entries.len(); i++ {
		e := ix.entry(i)
		if e.isDelta() && !e.known {
			if e.kind == typeRefDelta {
				return errMissingBase
			}
			return fmt.Errorf("the delta at offset %d has no base", e.off)
		}
	}
	return nil
}

var errMissingBase = errors.New("the pack refers to objects this repository does not have: fetch, rebase and push again")

// walk resolves the deltas on entry i, whose content is given (or nil: read or
// rebuilt when needed).
func (ix *indexer) walk(ctx context.Context, i int, content []byte, depth int) error {
	if depth > maxChainDepth {
		return errors.New("a delta chain is deeper than git allows")
	}
	// The walk owns content: it is handed back once no delta needs it.
	own := int64(len(content))
	ix.held += own
	defer func() {
		ix.held -= own
		if content != nil {
			ix.give(content)
		}
	}()
	pe := ix.entry(i)
	ks := ix.kidsOf(i, &pe)
	for k := 0; k < ks.len(); k++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := ix.kid(ks, k)
		ce := ix.entry(c)
		if ce.big || ce.known {
			continue
		}
		if content == nil {
			var err error
			if content, err = ix.materialize(i); err != nil {
				return err
			}
			own = int64(len(content))
			ix.held += own
		}
		result, err := ix.applyDelta(content, c, &ce)
		if err != nil {
			return err
		}
		ce.typ, ce.base = pe.typ, uint32(i)
		h := ix.hasher(ce.typ, int64(len(result)))
		h.Write(result)
		ce.id, ce.known = ix.sumID(), true
		ix.setEntry(c, &ce)
		if err := ix.check(ce.typ, ce.id, result); err != nil {
			return err
		}
		if ix.kidsOf(c, &ce).len() == 0 {
			ix.give(result)
			continue
		}
		// This base is dropped before going deeper when no delta of it is left, and
		// kept for the ones left only while the chain's bases fit the budget;
		// otherwise it is rebuilt for them.
		if k+1 == ks.len() || ix.held+int64(len(result)) > heldBudget {
			ix.held -= own
			own = 0
			ix.give(content)
			content = nil
		}
		if err := ix.walk(ctx, c, result, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// sortByID fills byID with the known objects, sorted by id (ties in pack order).
func (ix *indexer) sortByID() error {
	ix.byID.truncate(0)
	for i := 0; i < ix.entries.len(); i++ {
		if ix.entries.at(i)[44]&(1<<6) == 0 {
			continue
		}
		r, err := ix.byID.add()
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(r, uint32(i))
	}
	ix.byID.sortBy(func(a, b []byte) bool {
		x, y := u32(a), u32(b)
		if c := bytes.Compare(ix.idAt(int(x)), ix.idAt(int(y))); c != 0 {
			return c < 0
		}
		return x < y
	})
	return nil
}

// lookup finds a known object of the pack by id (after sortByID).
func (ix *indexer) lookup(id []byte) (int, bool) {
	k := ix.byID.search(func(r []byte) bool { return bytes.Compare(ix.idAt(int(u32(r))), id) >= 0 })
	if k < ix.byID.len() {
		if i := int(u32(ix.byID.at(k))); bytes.Equal(ix.idAt(i), id) {
			return i, true
		}
	}
	return 0, false
}

// checkConnected checks that every commit, tree and tag of the new pack refers only
// to objects that the pack or the repository holds. The repository was connected
// before the push, so this proves it still is, in time proportional to the push, not
// to the history.
func (ix *indexer) checkConnected() error {
	if ix.neededErr != nil {
		return ix.neededErr
	}
	ix.compactNeeded(false)
	for k := 0; k < ix.needed.len(); k++ {
		id := ix.needed.at(k)
		if _, ok := ix.lookup(id); ok {
			continue
		}
		if h := plumbing.Hash(id); !ix.has(h) {
			return fmt.Errorf("a pushed object refers to %s, which is neither in the push nor in the repository", h)
		}
	}
	return nil
}

// pathOf finds the path of object id in the trees of tips, walking the pushed
// commits and trees (only those of this pack, rebuilt from it one at a time).
func (ix *indexer) pathOf(tips []plumbing.Hash, id plumbing.Hash) string {
	seen := map[plumbing.Hash]bool{}
	content := func(h plumbing.Hash, t int8) []byte {
		i, ok := ix.lookup(h[:])
		if !ok || seen[h] {
			return nil
		}
		if e := ix.entry(i); e.typ != t || e.big {
			return nil
		}
		seen[h] = true
		b, err := ix.materialize(i)
		if err != nil {
			return nil
		}
		return b
	}
	var inTree func(tree plumbing.Hash, prefix string, depth int) string
	inTree = func(tree plumbing.Hash, prefix string, depth int) string {
		if depth > maxChainDepth {
			return ""
		}
		data := content(tree, typeTree)
		if data == nil {
			return ""
		}
		var found string
		var subtrees []fsck.Entry
		_ = fsck.ParseTree(data, func(e fsck.Entry) error {
			if plumbing.Hash(e.ID) == id {
				found = prefix + string(e.Name)
				return io.EOF
			}
			if e.IsDir() {
				subtrees = append(subtrees, fsck.Entry{Name: bytes.Clone(e.Name), ID: e.ID})
			}
			return nil
		})
		if found != "" {
			return found
		}
		for _, s := range subtrees {
			if p := inTree(plumbing.Hash(s.ID), prefix+string(s.Name)+"/", depth+1); p != "" {
				return p
			}
		}
		return ""
	}
	queue := append([]plumbing.Hash(nil), tips...)
	for len(queue) > 0 && len(seen) < 1_000_000 {
		h := queue[0]
		queue = queue[1:]
		data := content(h, typeCommit)
		if data == nil {
			continue
		}
		refs, err := fsck.CheckCommit(h.String(), data)
		if err != nil {
			continue
		}
		if p := inTree(plumbing.Hash(refs.Tree), "", 0); p != "" {
			return p
		}
		for _, p := range refs.Parents {
			queue = append(queue, plumbing.Hash(p))
		}
	}
	return ""
}

// tooLarge describes the first object over the limit.
func (ix *indexer) tooLarge(tips []plumbing.Hash) *TooLargeError {
	e := ix.entry(ix.firstBig)
	err := &TooLargeError{Size: e.size, Limit: ix.limit}
	if e.known {
		err.ID = e.id
		if ix.sortByID() == nil {
			err.Path = ix.pathOf(tips, e.id)
		}
	}
	return err
}
