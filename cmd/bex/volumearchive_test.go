package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bex.co/bex/internal/volumearchive"
)

// archiveCmd runs `bex volume-archive ARGS` with stdin in, as its helper pod
// would: stdout, stderr as main would print it, and the exit status.
func archiveCmd(t *testing.T, in io.Reader, args ...string) (stdout []byte, stderr string, code int) {
	t.Helper()
	var out bytes.Buffer
	stderr, code = archiveTo(&out, in, args...)
	return out.Bytes(), stderr, code
}

func archiveTo(out io.Writer, in io.Reader, args ...string) (stderr string, code int) {
	var errOut bytes.Buffer
	root, _ := newRoot(out, &errOut)
	root.SetIn(in)
	root.SetArgs(append([]string{"volume-archive"}, args...))
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		errOut.WriteString(ee.line + "\n")
		code = ee.code
	default:
		errOut.WriteString("bex: " + err.Error() + "\n")
		code = 1
	}
	return errOut.String(), code
}

// TestVolumeArchiveRoundTripAndRefusal: backup of a directory, restored into
// another: the same files; an archive with ../x is refused with one line and
// exit status 2, nothing written there nor beside; the handshake of a reader
// that attaches late.
func TestVolumeArchiveRoundTripAndRefusal(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "volume")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sub/a"), []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/a", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "old"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Ids relative to 0, as in a pod: the test's own files are its uid's.
	if os.Getuid() != 0 {
		t.Skip("bex volume-archive keeps ids relative to uid 0: run as root")
	}

	backup, stderr, code := archiveCmd(t, strings.NewReader(""), "backup", src)
	if code != 0 || stderr != "" || len(backup) == 0 {
		t.Fatalf("backup: exit %d, %q", code, stderr)
	}
	if _, stderr, code := archiveCmd(t, bytes.NewReader(backup), "restore", dst); code != 0 || stderr != "" {
		t.Fatalf("restore: exit %d, %q", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "link")); err != nil || string(b) != "one\n" {
		t.Fatalf("restored link: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dst, "old")); !os.IsNotExist(err) {
		t.Fatalf("the old file is still there: %v", err)
	}
	again, _, _ := archiveCmd(t, strings.NewReader(""), "backup", dst)
	if !bytes.Equal(again, backup) {
		t.Fatal("the backup of the restored directory differs")
	}

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	for _, name := range []string{"fine", "../x"} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 7}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte("escaped")); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "termination-log")
	out, stderr, code := archiveCmd(t, &hostile, "restore", "--termination-log", log, dst)
	if code != volumearchive.ExitRefused || len(out) != 0 || strings.Count(stderr, "\n") != 1 ||
		!strings.HasPrefix(stderr, "volumes:restore refused the archive") || !strings.Contains(stderr, `"../x"`) {
		t.Fatalf("a restore of ../x: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if b, _ := os.ReadFile(log); string(b)+"\n" != stderr {
		t.Errorf("termination log %q, want the line of stderr", b)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 1 {
		t.Errorf("written beside the volume: %v", ents)
	}
	if after, _, _ := archiveCmd(t, strings.NewReader(""), "backup", dst); !bytes.Equal(after, backup) {
		t.Error("the refused restore changed the volume")
	}

	// --handshake: ready lines until the reader's byte, then the archive.
	pr, pw := io.Pipe()
	var got bytes.Buffer
	readies := 0
	aw := &volumearchive.Awaiter{W: &got, Ready: func() { readies++; go pw.Write([]byte{'g'}) }}
	if stderr, c := archiveTo(aw, pr, "backup", "--handshake", src); c != 0 || stderr != "" {
		t.Fatalf("backup --handshake: exit %d, %q", c, stderr)
	}
	if !aw.Started || readies != 1 || !bytes.Equal(got.Bytes(), backup) {
		t.Fatalf("the archive after the handshake: started %v, ready %d times, %d bytes, want %d", aw.Started, readies, got.Len(), len(backup))
	}

	if _, stderr, code := archiveCmd(t, strings.NewReader(""), "restore", filepath.Join(dst, "nope")); code != 1 || !strings.HasPrefix(stderr, "volumes:restore failed: open the volume") {
		t.Errorf("restore into a missing directory: exit %d, %q", code, stderr)
	}
}
