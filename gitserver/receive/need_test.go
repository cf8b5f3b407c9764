package receive

import (
	"bytes"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// TestNeedSkipsOnlyWhatItHolds: the cache in front of the table of needed ids
// skips an id only while the table holds it. Ids that share a slot evict each
// other and are noted again, the zero id (what an empty slot holds) is never
// skipped, and every id noted, however often, interleaved and across however
// many compactions, is in the table at the end and found missing.
func TestNeedSkipsOnlyWhatItHolds(t *testing.T) {
	ix := newIndexer(nil, 0, 0, func(plumbing.Hash) bool { return false })
	defer ix.close()
	ix.count = 4
	ix.neededCap = 8 // compacted every few ids
	var a, b, c, zero plumbing.Hash
	a[0], a[19] = 1, 0xaa
	b[0], b[2], b[19] = 1, 1, 0xbb // a's slot
	c[0], c[1] = 2, 0xcc
	for range 50 {
		for _, id := range []plumbing.Hash{a, b, zero, c, a} {
			ix.need(id[:])
		}
	}
	if ix.neededErr != nil {
		t.Fatal(ix.neededErr)
	}
	ix.compactNeeded(false)
	var got []plumbing.Hash
	for k := 0; k < ix.needed.len(); k++ {
		got = append(got, plumbing.Hash(ix.needed.at(k)))
	}
	want := []plumbing.Hash{zero, a, b, c}
	if len(got) != len(want) {
		t.Fatalf("needed = %v, want %v", got, want)
	}
	for k := range want {
		if !bytes.Equal(got[k][:], want[k][:]) {
			t.Fatalf("needed = %v, want %v", got, want)
		}
	}
	if err := ix.checkConnected(); err == nil {
		t.Fatal("ids that neither the pack nor the repository holds were not found missing")
	}
}
