package receive

import (
	"fmt"

	"github.com/go-git/go-git/v5/plumbing"
)

// Limits bound what one pack may hold.
type Limits struct {
	// MaxPackBytes bounds the received size of the pack (0: no bound).
	MaxPackBytes int64
	// MaxObjectBytes bounds the inflated size of each object (0: 1 GiB; there is
	// always a bound, since objects up to it are held in memory). It is checked on
	// the size that each entry declares, before anything is inflated.
	MaxObjectBytes int64
	// Tips are the commits the push names; an object over the limit is named by
	// its path in their trees.
	Tips []plumbing.Hash
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
	return fmt.Sprintf("%s is %s, more than the limit of %s per file", what, HumanBytes(e.Size), HumanBytes(e.Limit))
}

// HumanBytes writes n in binary units with one decimal below 10 ("1.0 GiB",
// "100 MiB").
func HumanBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	if f < 10 {
		return fmt.Sprintf("%.1f %s", f, units[i])
	}
	return fmt.Sprintf("%.0f %s", f, units[i])
}
