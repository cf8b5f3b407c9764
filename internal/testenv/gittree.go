package testenv

import (
	"encoding/hex"
	"testing"
)

// TreeEntry is one entry of a git tree: mode as git writes it (100644, 100755,
// 120000, 40000, 160000, or anything else a test wants refused), name, object id.
type TreeEntry struct{ Mode, Name, ID string }

// RawTree is the bytes of a tree object with entries in the order given,
// duplicates and all: "<mode> <name>\0<20-byte id>" each. Written with
// `git hash-object -t tree --literally`, it is a tree git mktree and fsck would
// refuse, as a hostile push may carry.
func RawTree(t testing.TB, entries ...TreeEntry) []byte {
	t.Helper()
	var b []byte
	for _, e := range entries {
		id, err := hex.DecodeString(e.ID)
		if err != nil || len(id) != 20 {
			t.Fatalf("tree entry %q: bad object id %q", e.Name, e.ID)
		}
		b = append(b, e.Mode+" "+e.Name+"\x00"...)
		b = append(b, id...)
	}
	return b
}
