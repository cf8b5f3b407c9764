package receive

import (
	"bufio"
	"crypto/sha1"
	"encoding/binary"
	"io"
	"os"

	"github.com/go-git/go-git/v5/plumbing"
)

// writeIndex writes the pack's index to path: git's .idx version 2, streamed
// from the objects sorted by id (byID), so that nothing but the tables is held
// for it (go-git's idxfile writer holds about 90 bytes an object, twice).
//
// The format: a magic and version, a fan-out table of 256 counts (of ids whose
// first byte is at most its index), the ids, their CRC-32s, their offsets in 31
// bits (or, with the high bit, an index into a table of 64-bit offsets for a pack
// over 2 GiB), that table, the pack's checksum, and the index's own.
func (ix *indexer) writeIndex(path string, packSum plumbing.Hash) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	sum := sha1.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, sum), 256<<10)
	n := ix.byID.len()
	at := func(k int) []byte { return ix.entries.at(int(u32(ix.byID.at(k)))) }
	var b [8]byte
	u32be := func(v uint32) {
		binary.BigEndian.PutUint32(b[:4], v)
		w.Write(b[:4])
	}
	w.Write([]byte{0xff, 't', 'O', 'c'})
	u32be(2)
	var fanout [256]uint32
	for k := 0; k < n; k++ {
		fanout[at(k)[0]]++
	}
	total := uint32(0)
	for _, c := range fanout {
		total += c
		u32be(total)
	}
	for k := 0; k < n; k++ {
		w.Write(at(k)[0:20])
	}
	for k := 0; k < n; k++ {
		u32be(getEntry(at(k)).crc)
	}
	large := uint32(0)
	for k := 0; k < n; k++ {
		if off := uint64(getEntry(at(k)).off); off > 0x7fffffff {
			u32be(0x80000000 | large)
			large++
		} else {
			u32be(uint32(off))
		}
	}
	for k := 0; k < n; k++ {
		if off := uint64(getEntry(at(k)).off); off > 0x7fffffff {
			binary.BigEndian.PutUint64(b[:], off)
			w.Write(b[:])
		}
	}
	w.Write(packSum[:])
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := f.Write(sum.Sum(nil)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}
