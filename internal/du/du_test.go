package du_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"bex.co/bex/internal/du"
)

// Bytes agrees with the real `du -sbx` on a tree with a hard link (counted
// once), a symbolic link (as a link) and an empty directory; a Counter counts
// what two trees share once; a missing path is 0.
func TestBytesIsDuSbx(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{a, b, filepath.Join(a, "empty")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(a, "big"), make([]byte, 300_001), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(a, "big"), filepath.Join(a, "again")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(a, "big"), filepath.Join(b, "shared")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("big", filepath.Join(a, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, dir} {
		out, err := exec.Command("du", "-sbx", p).Output()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
		if got, err := du.Bytes(p); err != nil || got != want {
			t.Errorf("Bytes(%s) = %d, %v; du -sbx says %d", p, got, err, want)
		}
	}
	var c du.Counter
	first, _ := c.Add(a)
	second, _ := c.Add(b)
	if whole, _ := du.Bytes(dir); first+second+mustSize(t, dir) != whole {
		t.Errorf("a %d + b %d + the directory itself != %d: the shared file counted twice", first, second, whole)
	}
	if n, err := du.Bytes(filepath.Join(dir, "none")); n != 0 || err != nil {
		t.Errorf("a missing path: %d, %v", n, err)
	}
}

func mustSize(t *testing.T, p string) int64 {
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
