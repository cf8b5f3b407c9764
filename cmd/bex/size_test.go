package main

import "testing"

func TestByteSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{"100MiB": 100 << 20, "100Mi": 100 << 20, "1GiB": 1 << 30, "1048576": 1 << 20, "500M": 500e6} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "-1", "0", "lots", "1.5.5Gi"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) accepted: %d", in, b)
		}
	}
	b := byteSize(100 << 20)
	if b.String() != "100MiB" {
		t.Errorf("String() = %q", b.String())
	}
}
