package bytesize

import (
	"math"
	"testing"
)

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		0:                "0 B",
		-5:               "-5 B",
		512:              "512 B",
		1023:             "1023 B",
		1024:             "1.0 KiB",
		16 << 10:         "16 KiB",
		512 << 10:        "512 KiB",
		1 << 20:          "1.0 MiB",
		3<<20 + 700<<10:  "3.6 MiB",
		12<<20 + 800<<10: "12 MiB",
		10<<30 - 1:       "9.9 GiB",
		612 << 20:        "612 MiB",
		100 << 20:        "100 MiB",
		1 << 30:          "1.0 GiB",
		1536 << 20:       "1.5 GiB",
		10 << 30:         "10 GiB",
		1 << 40:          "1.0 TiB",
		math.MaxInt64:    "8.0 EiB",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatUint(t *testing.T) {
	for n, want := range map[uint64]string{
		612 << 20:      "612 MiB",
		1 << 30:        "1.0 GiB",
		math.MaxUint64: "16 EiB",
	} {
		if got := FormatUint(n); got != want {
			t.Errorf("FormatUint(%d) = %q, want %q", n, got, want)
		}
	}
}
