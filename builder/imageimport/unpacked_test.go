package imageimport

import (
	"archive/tar"
	"bytes"
	"errors"
	"testing"
)

// A file's size counts when its entry is read, before its data: an entry
// that declares 1 TiB (a sparse file's, short in the stream and written out in
// full on unpack) is refused at its header.
func TestCountTakesAFilesDeclaredSize(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "huge", Mode: 0o644, Size: 1 << 40, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	b := newUnpackBudget(1<<20, []string{"sha256:a"})
	if err := b.count("sha256:a", bytes.NewReader(buf.Bytes())); !errors.Is(err, errUnpacksPast) {
		t.Fatalf("an entry of 1 TiB, bound 1 MiB: %v", err)
	}
}

// A layer listed twice weighs twice; one counted again (a retried upload)
// replaces its count; what was not read to its end is uncounted.
func TestBudget(t *testing.T) {
	b := newUnpackBudget(100, []string{"sha256:a", "sha256:b", "sha256:a"})
	if err := b.set("sha256:a", 40); err != nil {
		t.Fatal(err)
	}
	if err := b.set("sha256:a", 10); err != nil || b.total != 20 {
		t.Fatalf("recounted: total %d, %v", b.total, err)
	}
	b.done("sha256:a")
	if u := b.uncounted(); len(u) != 1 || u[0] != "sha256:b" {
		t.Fatalf("uncounted %v", u)
	}
	if err := b.set("sha256:a", 51); !errors.Is(err, errUnpacksPast) || b.total != 102 {
		t.Fatalf("twice 51 past 100: %v", err)
	}
}
