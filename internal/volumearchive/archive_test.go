package volumearchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"bex.co/bex/internal/volumearchive/archivetest"
)

// These tests work on a directory of the test's own (ids relative to the
// test's uid: base is os.Getuid()); what needs root (owners other than the
// test's, a file system small enough to fill) is skipped without it. The local
// runtime's TestVolumeBackupDestroyCreateRestore runs the same on a mounted
// volume with the app paused; cmd/bex's TestVolumeArchive, the command a
// cluster's helper pod runs.

func tarNames(b []byte) []string {
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// fill writes the test volume: files, a binary file, links of each kind, modes,
// a fifo (left out of a backup).
func fill(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "sub/deep"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "sub/deep/a"), []byte("one\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "b"), []byte("two\x00bytes"), 0o640))
	bin := make([]byte, 300000)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	must(os.WriteFile(filepath.Join(dir, "random.bin"), bin, 0o600))
	must(os.Symlink("sub/deep/a", filepath.Join(dir, "rel-link")))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "abs-link")))
	must(os.Link(filepath.Join(dir, "b"), filepath.Join(dir, "hard")))
	must(os.Chmod(filepath.Join(dir, "sub"), 0o711))
	must(unix.Mkfifo(filepath.Join(dir, "sub/fifo"), 0o644))
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(filepath.Join(dir, "sub/deep"), old, old))
}

// TestRoundTrip: an archive of a directory restored into an empty one gives
// the same names, modes, owners, links and contents, and its archive is the
// same bytes; fifos are left out.
func TestRoundTrip(t *testing.T) {
	base := uint32(os.Getuid())
	src, dst := t.TempDir(), t.TempDir()
	fill(t, src)
	if os.Getuid() == 0 {
		if err := os.Lchown(filepath.Join(src, "b"), int(base)+1000, int(base)+1001); err != nil {
			t.Fatal(err)
		}
	}
	want := archivetest.Tree(t, src, base)
	delete(want, "sub/fifo")
	ctx := context.Background()

	var backup bytes.Buffer
	if err := Write(ctx, openRoot(t, src), base, &backup); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tarNames(backup.Bytes()), " "); got != "abs-link b hard random.bin rel-link sub/ sub/deep/ sub/deep/a" {
		t.Fatalf("archive entries %q", got)
	}
	if err := Restore(ctx, openRoot(t, dst), base, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got := archivetest.Tree(t, dst, base); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored:\n%v\nwant:\n%v", got, want)
	}
	var again bytes.Buffer
	if err := Write(ctx, openRoot(t, dst), base, &again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), backup.Bytes()) {
		t.Fatal("the archive of the restored directory differs from the one restored")
	}
	// A restore replaces what was there: the old files go.
	if err := os.WriteFile(filepath.Join(dst, "stale"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A staging directory left by a killed restore goes too.
	if err := os.Mkdir(filepath.Join(dst, StagingPrefix+"leftover"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Restore(ctx, openRoot(t, dst), base, bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got := archivetest.Tree(t, dst, base); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("restored over other files:\n%v\nwant:\n%v", got, want)
	}
}

// TestIDs: host ids outside the app's range are written as nobody; an
// archive's ids beyond 65535 become the app's root.
func TestIDs(t *testing.T) {
	if containerID32(5, 100000) != 65534 || containerID32(100000+7, 100000) != 7 || containerID32(100000+IDRangeSize, 100000) != 65534 {
		t.Error("containerID32")
	}
	if hostID32(7, 100000) != 100007 || hostID32(IDRangeSize, 100000) != 100000 || hostID32(-1, 100000) != 100000 {
		t.Error("hostID32")
	}
}

// TestHostileArchives: each kind of hostile archive is refused (ErrBadArchive)
// and leaves the directory exactly as it was, nothing written outside it.
func TestHostileArchives(t *testing.T) {
	base := uint32(os.Getuid())
	parent := t.TempDir()
	dir := filepath.Join(parent, "volume")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fill(t, dir)
	want := archivetest.Tree(t, dir, base)
	ctx := context.Background()
	var good bytes.Buffer
	if err := Write(ctx, openRoot(t, dir), base, &good); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	hostile := archivetest.Hostiles(t, outside, good.Bytes())
	for _, h := range hostile {
		err := Restore(ctx, openRoot(t, dir), base, bytes.NewReader(h.Tar))
		if err == nil || !errors.Is(err, ErrBadArchive) {
			t.Errorf("%s: Restore = %v, want a refusal (ErrBadArchive)", h.Name, err)
		}
		if got := archivetest.Tree(t, dir, base); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the directory changed:\n%v\nwant:\n%v", h.Name, got, want)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Errorf("%s: written outside: %v", h.Name, ents)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Errorf("%s: written beside the directory: %v", h.Name, ents)
		}
	}
}

// TestFullIsARefusal: an archive bigger than the file system, or with more
// files than it has inodes, is refused as "the volume is full", the volume as
// it was (a tmpfs of 1 MiB and 64 inodes stands for a small volume; root only).
func TestFullIsARefusal(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a small file system")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=64,mode=0755"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := archivetest.Tree(t, dir, 0)
	ctx := context.Background()
	big := archivetest.TarOf(t, tar.Header{Name: "big", Typeflag: tar.TypeReg, Linkname: strings.Repeat("z", 2<<20)})
	if err := Restore(ctx, openRoot(t, dir), 0, bytes.NewReader(big)); !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "the volume is full") {
		t.Errorf("2 MiB into 1 MiB: %v", err)
	}
	if got := archivetest.Tree(t, dir, 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the archive too big: %v", got)
	}
	var bomb bytes.Buffer
	tw := tar.NewWriter(&bomb)
	for i := range 500 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%d/f%d", i/100, i), Mode: 0o644, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Restore(ctx, openRoot(t, dir), 0, bytes.NewReader(bomb.Bytes())); !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "the volume is full") {
		t.Errorf("500 files into 64 inodes: %v", err)
	}
	if got := archivetest.Tree(t, dir, 0); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the tar bomb: %v", got)
	}
}

// TestWriteStopsWithCtx: a backup ends when its context does.
func TestWriteStopsWithCtx(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Write(ctx, openRoot(t, dir), uint32(os.Getuid()), &bytes.Buffer{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write with an ended ctx: %v", err)
	}
}
