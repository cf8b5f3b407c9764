package receive

import (
	"fmt"
	"strconv"

	"github.com/go-git/go-git/v5/plumbing"

	"bex.co/bex/internal/bytesize"
)

// Limits bound what one pack may hold.
type Limits struct {
	// MaxPackBytes bounds the received size of the pack (0: no bound).
	MaxPackBytes int64
	// MaxObjectBytes bounds the inflated size of each object (0: 1 GiB; there is
	// always a bound, since objects up to it are held in memory). It is checked on
	// the size that each entry declares, before anything is inflated.
	MaxObjectBytes int64
	// MaxObjects bounds the objects of a pack (0: DefaultMaxObjects), checked on
	// the count its header announces, before any object is read: indexing costs
	// memory per object (about 70 bytes, see records).
	MaxObjects int64
	// Tips are the commits the push names; an object over the limit is named by
	// its path in their trees.
	Tips []plumbing.Hash
}

// DefaultMaxObjects is the default bound on the objects of one pack: 2 million.
// A push costs about 90 bytes an object (measured: a push of a million small
// files raised a gitserver from 47 to 131 MiB; the indexer's tables are about 70
// of those, up to about 120 for a pack of REF_DELTAs whose trees name objects
// many times), so a push at the bound costs about 170 MiB at its peak, less than
// the two objects of the object limit (2 x 100 MiB) that a push may hold besides,
// and a gitserver (under 50 MiB idle) stays under 256 MiB. Git's own receive has
// no such bound, nor does GitHub (a 2 GiB pack of the smallest objects could
// announce a hundred million); this one is per push, not per repository: a larger
// history arrives in parts, older commits first. Most apps' histories are far
// below it (git's own repository holds about 400,000 objects).
const DefaultMaxObjects = 2_000_000

// MaxObjectsLimit is the largest Limits.MaxObjects: entries are numbered in 32
// bits, and a thin pack's completion may add as many bases as it has deltas.
const MaxObjectsLimit = 1<<31 - 1

// TooManyObjectsError refuses a pack that announces more objects than
// Limits.MaxObjects.
type TooManyObjectsError struct {
	Objects, Limit int64
}

func (e *TooManyObjectsError) Error() string {
	return fmt.Sprintf("the push holds %s objects, more than the limit of %s per push", thousands(e.Objects), thousands(e.Limit))
}

// thousands writes n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TooLargeError refuses an object larger than Limits.MaxObjectBytes.
type TooLargeError struct {
	// Path is the object's path in the pushed trees ("" when it was not found there,
	// or when the object is a delta that was not resolved).
	Path string
	// ID is the object's id, zero for a delta whose result was not computed.
	ID plumbing.Hash
	// Size is the declared size, Limit the limit.
	Size, Limit int64
}

func (e *TooLargeError) Error() string {
	what := e.Path
	switch {
	case what != "":
	case !e.ID.IsZero():
		what = "object " + e.ID.String()[:7]
	default:
		what = "an object of the push"
	}
	return fmt.Sprintf("%s is %s, more than the limit of %s per file", what, bytesize.Format(e.Size), bytesize.Format(e.Limit))
}
