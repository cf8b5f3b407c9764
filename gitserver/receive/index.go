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

	"github.com/go-git/go-git/v5/plumbing"

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

// entry is one object of the pack as indexed.
type entry struct {
	off     int64 // of the entry's header
	dataOff int64 // of its zlib stream
	size    int64 // declared inflated size (of the delta data, for a delta)
	result  int64 // a delta's declared result size
	baseOff int64 // an OFS_DELTA's base
	baseRef plumbing.Hash
	id      plumbing.Hash
	crc     uint32
	kind    int8 // the entry's type in the pack
	typ     int8 // the object's type, once known
	known   bool // id and typ are set
	big     bool // over the object limit: not resolved, refused
}

func (e *entry) isDelta() bool { return e.kind == typeOfsDelta || e.kind == typeRefDelta }

// indexer indexes one pack with bounded memory: whole objects are held only up to
// the object limit, and only commits, trees, tags and delta bases are held at all.
type indexer struct {
	f       *os.File
	limit   int64 // per object; 0: none
	entries []entry
	byID    map[plumbing.Hash]int
	// children lists the deltas on each entry; refWait the REF_DELTAs whose base is
	// not known yet, by base id.
	children map[int][]int
	refWait  map[plumbing.Hash][]int
	// needed are the ids that new commits, trees and tags refer to.
	needed   map[plumbing.Hash]struct{}
	firstBig int // index of the first entry over the limit, -1 if none
	held     int64
	// spare holds buffers of dropped contents for the next ones: large objects
	// then reuse memory instead of leaving garbage that the GC lets grow the heap.
	spare [][]byte
	// fsckErr is the first fsck finding; the pack is still read to its end, so
	// that the pusher gets the refusal rather than a broken pipe.
	fsckErr error
}

func newIndexer(f *os.File, limit int64) *indexer {
	return &indexer{f: f, limit: limit, byID: map[plumbing.Hash]int{},
		children: map[int][]int{}, refWait: map[plumbing.Hash][]int{}, needed: map[plumbing.Hash]struct{}{}, firstBig: -1}
}

// atOffset finds the entry at a pack offset: entries are in pack order, so a
// search takes the place of a map of every offset.
func (ix *indexer) atOffset(off int64) (int, bool) {
	i := sort.Search(len(ix.entries), func(i int) bool { return ix.entries[i].off >= off })
	return i, i < len(ix.entries) && ix.entries[i].off == off
}

func (ix *indexer) over(n int64) bool { return ix.limit > 0 && n > ix.limit }

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

// readHeader reads an entry's type and size, and a delta's base.
func readHeader(br io.ByteReader, e *entry) error {
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
		e.baseOff = e.off - rel
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

// inflateExact copies exactly size inflated bytes of zr to w and checks that the
// stream ends there (its checksum included). More bytes than declared is an error
// as soon as one is seen, so a zlib bomb is never inflated past its header's word.
func inflateExact(zr io.Reader, w io.Writer, size int64) error {
	n, err := io.Copy(w, io.LimitReader(zr, size))
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

// collector keeps what is written to it up to a bound.
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
// the deltas. It returns the object count and the pack's size.
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
	var zr io.ReadCloser
	for i := uint32(0); i < count; i++ {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if err := s.flush(); err != nil {
			return 0, 0, err
		}
		s.crc.Reset()
		e := entry{off: s.offset()}
		if err := readHeader(s, &e); err != nil {
			return 0, 0, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		e.dataOff = s.offset()
		if e.kind == typeOfsDelta {
			if _, ok := ix.atOffset(e.baseOff); !ok {
				return 0, 0, fmt.Errorf("reading object %d of %d: its delta base is not an object of the pack", i+1, count)
			}
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
		if err := ix.inflateEntry(zr, &e); err != nil {
			return 0, 0, fmt.Errorf("reading object %d of %d: %w", i+1, count, err)
		}
		if err := s.flush(); err != nil {
			return 0, 0, err
		}
		e.crc = s.crc.Sum32()
		if err := ix.add(e); err != nil {
			return 0, 0, err
		}
	}
	if err := s.flush(); err != nil {
		return 0, 0, err
	}
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
	return count, s.offset(), nil
}

// inflateEntry inflates one entry as it arrives: a whole object is hashed (and
// checked, for a commit, tree or tag); a delta is only measured.
func (ix *indexer) inflateEntry(zr io.Reader, e *entry) error {
	if e.isDelta() {
		if ix.over(e.size) {
			e.big = true
			e.result = e.size
			return inflateExact(zr, io.Discard, e.size)
		}
		var dh deltaHead
		if err := inflateExact(zr, &dh, e.size); err != nil {
			return err
		}
		if dh.n < 2 || dh.bad {
			return errors.New("malformed delta header")
		}
		e.result = dh.vals[1]
		if ix.over(e.result) {
			e.big = true
		}
		return nil
	}
	e.typ = e.kind
	h := plumbing.NewHasher(plumbing.ObjectType(e.typ), e.size)
	if ix.over(e.size) {
		// Streamed to learn its id (to name its path), never held.
		e.big = true
		if err := inflateExact(zr, h, e.size); err != nil {
			return err
		}
		e.id, e.known = h.Sum(), true
		return nil
	}
	if e.typ == typeBlob {
		if err := inflateExact(zr, h, e.size); err != nil {
			return err
		}
		e.id, e.known = h.Sum(), true
		return nil
	}
	c := &collector{b: make([]byte, 0, min(e.size, 1<<20))}
	if err := inflateExact(zr, io.MultiWriter(h, c), e.size); err != nil {
		return err
	}
	e.id, e.known = h.Sum(), true
	return ix.check(e.typ, e.id, c.b)
}

// add records an entry of pass 1.
func (ix *indexer) add(e entry) error {
	i := len(ix.entries)
	ix.entries = append(ix.entries, e)
	if e.big && ix.firstBig < 0 {
		ix.firstBig = i
	}
	switch e.kind {
	case typeOfsDelta:
		b, _ := ix.atOffset(e.baseOff)
		ix.children[b] = append(ix.children[b], i)
	case typeRefDelta:
		if b, ok := ix.byID[e.baseRef]; ok {
			ix.children[b] = append(ix.children[b], i)
		} else {
			ix.refWait[e.baseRef] = append(ix.refWait[e.baseRef], i)
		}
	default:
		ix.known(i)
	}
	return nil
}

// known files entry i under its id and takes over the deltas waiting for it.
func (ix *indexer) known(i int) {
	id := ix.entries[i].id
	if _, dup := ix.byID[id]; dup {
		return
	}
	ix.byID[id] = i
	if waiting, ok := ix.refWait[id]; ok {
		ix.children[i] = append(ix.children[i], waiting...)
		delete(ix.refWait, id)
	}
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
	return nil
}

func (ix *indexer) checkObject(t int8, id plumbing.Hash, data []byte) error {
	hexID := id.String()
	switch t {
	case typeCommit:
		refs, err := fsck.CheckCommit(hexID, data)
		if err != nil {
			return err
		}
		ix.needed[refs.Tree] = struct{}{}
		for _, p := range refs.Parents {
			ix.needed[p] = struct{}{}
		}
	case typeTree:
		return fsck.CheckTree(hexID, data, func(e fsck.Entry) {
			if !e.IsGitlink() {
				ix.needed[e.ID] = struct{}{}
			}
		})
	case typeTag:
		refs, err := fsck.CheckTag(hexID, data)
		if err != nil {
			return err
		}
		ix.needed[refs.Object] = struct{}{}
	}
	return nil
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

// inflater opens the zlib stream of entry e in the file.
func (ix *indexer) inflater(e *entry) (io.ReadCloser, *bufio.Reader, error) {
	sr := io.NewSectionReader(ix.f, e.dataOff, 1<<62)
	zr, err := zlib.NewReader(bufio.NewReaderSize(sr, 32<<10))
	if err != nil {
		return nil, nil, err
	}
	return zr, bufio.NewReaderSize(zr, 32<<10), nil
}

// readWhole inflates a whole (non-delta) entry from the file.
func (ix *indexer) readWhole(e *entry) ([]byte, error) {
	zr, br, err := ix.inflater(e)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	buf := ix.take(e.size)[:e.size]
	if _, err := io.ReadFull(br, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// applyDelta rebuilds delta entry e on base, reading its instructions from the
// file as they are applied: only the base and the result are in memory.
func (ix *indexer) applyDelta(base []byte, e *entry) ([]byte, error) {
	zr, br, err := ix.inflater(e)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	baseSize, resultSize, err := deltaSizes(br)
	if err != nil {
		return nil, err
	}
	if baseSize != int64(len(base)) || resultSize != e.result {
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

// base returns the index of a delta's base.
func (ix *indexer) base(e *entry) int {
	if e.kind == typeOfsDelta {
		b, _ := ix.atOffset(e.baseOff)
		return b
	}
	return ix.byID[e.baseRef]
}

// materialize rebuilds entry i's content from the whole object at the root of
// its chain, holding two objects at a time.
func (ix *indexer) materialize(i int) ([]byte, error) {
	chain := []int{i}
	for ix.entries[chain[len(chain)-1]].isDelta() {
		if len(chain) > maxChainDepth {
			return nil, errors.New("a delta chain is deeper than git allows")
		}
		chain = append(chain, ix.base(&ix.entries[chain[len(chain)-1]]))
	}
	content, err := ix.readWhole(&ix.entries[chain[len(chain)-1]])
	if err != nil {
		return nil, err
	}
	for j := len(chain) - 2; j >= 0; j-- {
		next, err := ix.applyDelta(content, &ix.entries[chain[j]])
		if err != nil {
			return nil, err
		}
		ix.give(content)
		content = next
	}
	return content, nil
}

// resolve is pass 2: every delta is rebuilt, hashed and checked, depth first
// from the whole objects, in pack order.
func (ix *indexer) resolve(ctx context.Context) error {
	for i := 0; i < len(ix.entries); i++ {
		e := &ix.entries[i]
		if e.isDelta() || e.big || len(ix.children[i]) == 0 {
			continue
		}
		if err := ix.walk(ctx, i, nil, 1); err != nil {
			return err
		}
	}
	for i := range ix.entries {
		e := &ix.entries[i]
		if e.isDelta() && !e.known && !ix.underBig(i) {
			if e.kind == typeRefDelta {
				return errMissingBase
			}
			return fmt.Errorf("the delta at offset %d has no base", e.off)
		}
	}
	return nil
}

var errMissingBase = errors.New("the pack refers to objects this repository does not have: fetch, rebase and push again")

// underBig reports whether a delta's chain goes through an object over the limit.
func (ix *indexer) underBig(i int) bool {
	for n := 0; n <= maxChainDepth; n++ {
		e := &ix.entries[i]
		if e.big {
			return true
		}
		if !e.isDelta() {
			return false
		}
		if e.kind == typeRefDelta {
			b, ok := ix.byID[e.baseRef]
			if !ok {
				return false
			}
			i = b
		} else {
			i, _ = ix.atOffset(e.baseOff)
		}
	}
	return false
}

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
	for k := 0; k < len(ix.children[i]); k++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := ix.children[i][k]
		ce := &ix.entries[c]
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
		pe := &ix.entries[i]
		result, err := ix.applyDelta(content, ce)
		if err != nil {
			return err
		}
		ce.typ = pe.typ
		h := plumbing.NewHasher(plumbing.ObjectType(ce.typ), int64(len(result)))
		h.Write(result)
		ce.id, ce.known = h.Sum(), true
		if err := ix.check(ce.typ, ce.id, result); err != nil {
			return err
		}
		ix.known(c)
		if len(ix.children[c]) == 0 {
			ix.give(result)
			continue
		}
		// This base is dropped before going deeper when no delta of it is left, and
		// kept for the ones left only while the chain's bases fit the budget;
		// otherwise it is rebuilt for them.
		if k+1 == len(ix.children[i]) || ix.held+int64(len(result)) > heldBudget {
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

// pathOf finds the path of object id in the trees of tips, walking the pushed
// commits and trees (only those of this pack, rebuilt from it one at a time).
func (ix *indexer) pathOf(tips []plumbing.Hash, id plumbing.Hash) string {
	seen := map[plumbing.Hash]bool{}
	content := func(h plumbing.Hash, t int8) []byte {
		i, ok := ix.byID[h]
		if !ok || seen[h] || ix.entries[i].typ != t || ix.entries[i].big {
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
	e := &ix.entries[ix.firstBig]
	err := &TooLargeError{Size: e.size, Limit: ix.limit}
	if e.isDelta() {
		err.Size = e.result
	}
	if e.known {
		err.ID = e.id
		err.Path = ix.pathOf(tips, e.id)
	}
	return err
}
