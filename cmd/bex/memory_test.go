package main

import (
	"strings"
	"testing"
)

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "4Gi": 4 << 30, "512Mi": 512 << 20, "1G": 1_000_000_000, "67108864": 64 << 20} {
		if got, err := parseMemory("--build-memory", in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"lots", "-1Gi", "0", "100Ki"} {
		if _, err := parseMemory("--build-memory", in); err == nil || !strings.HasPrefix(err.Error(), "--build-memory ") {
			t.Errorf("%q: %v", in, err)
		}
	}
}
