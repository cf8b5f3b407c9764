package receive

import (
	"crypto/sha1"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
)

// TestIndexOfAPackOver2GiB: objects past 2 GiB get 64-bit offsets, as git writes
// them; go-git's reader finds every object at its offset with its CRC. (A pack of
// small objects, where the offsets fit 31 bits, is compared byte for byte with
// git index-pack's in TestManySmallObjectsCostLittleMemory.)
func TestIndexOfAPackOver2GiB(t *testing.T) {
	ix := newIndexer(nil, 0, 0, nil)
	defer ix.close()
	offs := []int64{12, 1 << 20, 1<<31 - 1, 1 << 31, 5 << 30, 1<<40 + 7}
	for i, off := range offs {
		e := entry{off: off, crc: uint32(i) * 7919, known: true, kind: typeBlob, typ: typeBlob, base: noBase}
		e.id = plumbing.Hash(sha1.Sum(binary.BigEndian.AppendUint64(nil, uint64(off))))
		if err := ix.add(&e, plumbing.ZeroHash); err != nil {
			t.Fatal(err)
		}
	}
	if err := ix.sortByID(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pack.idx")
	packSum := plumbing.NewHash("0123456789abcdef0123456789abcdef01234567")
	if err := ix.writeIndex(path, packSum); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	idx := idxfile.NewMemoryIndex()
	if err := idxfile.NewDecoder(f).Decode(idx); err != nil {
		t.Fatal(err)
	}
	if idx.PackfileChecksum != packSum {
		t.Fatalf("pack checksum %s", idx.PackfileChecksum)
	}
	if n, _ := idx.Count(); n != int64(len(offs)) {
		t.Fatalf("%d objects, want %d", n, len(offs))
	}
	for i, off := range offs {
		e := ix.entry(i)
		got, err := idx.FindOffset(e.id)
		if err != nil || got != off {
			t.Errorf("object %d: offset %d, %v; want %d", i, got, err, off)
		}
		if crc, err := idx.FindCRC32(e.id); err != nil || crc != e.crc {
			t.Errorf("object %d: CRC %d, %v; want %d", i, crc, err, e.crc)
		}
	}
}
