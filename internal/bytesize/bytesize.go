package bytesize

import (
	"fmt"
	"math"
)

// units are the binary units past bytes, in order.
var units = []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// Format writes n as described in the package comment: "512 B", "1.0 GiB",
// "100 MiB". A negative n is written in bytes.
func Format(n int64) string {
	if n < 0 {
		return fmt.Sprintf("%d B", n)
	}
	return FormatUint(uint64(n))
}

// FormatUint is Format of an unsigned amount (a file system's free and total
// bytes).
func FormatUint(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	// Rounded down, as the old gitserver's did: a free space or a margin never
	// reads as more than it is (12.8 MiB is "12 MiB", 3.96 MiB "3.9 MiB").
	if f < 10 {
		return fmt.Sprintf("%.1f %s", math.Floor(f*10)/10, units[i])
	}
	return fmt.Sprintf("%.0f %s", math.Floor(f), units[i])
}
