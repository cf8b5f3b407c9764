// Package archivetest has what the tests of volume archives share: a
// directory's description, archives made of headers, and the hostile archives
// every restore must refuse (internal/volumearchive's unit tests, the local
// runtime's test on a mounted volume).
package archivetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Tree describes dir: each path's mode, ids relative to base, and contents or
// link target.
func Tree(t *testing.T, dir string, base uint32) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		v := fmt.Sprintf("%o %d:%d ", st.Mode, int64(st.Uid)-int64(base), int64(st.Gid)-int64(base))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += "-> " + l
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += fmt.Sprintf("%d nlink=%d %q", len(b), st.Nlink, b)
		}
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TarOf makes an archive of entries; a regular file's body is its Linkname.
func TarOf(t *testing.T, entries ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		body := []byte(h.Linkname)
		if h.Typeflag == tar.TypeReg {
			h.Linkname = ""
			h.Size = int64(len(body))
		} else {
			body = nil
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// FineThen is an archive of a fine file ("fine") and then one named name,
// which a restore must refuse when name leaves the volume.
func FineThen(t *testing.T, name string) []byte {
	t.Helper()
	return TarOf(t, tar.Header{Name: "fine", Typeflag: tar.TypeReg, Linkname: "ok"},
		tar.Header{Name: name, Typeflag: tar.TypeReg, Linkname: "escaped"})
}

// Names are the names of an archive's entries, in order, as far as it reads.
func Names(b []byte) []string {
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			return names
		}
		names = append(names, h.Name)
	}
}

// Hostile is an archive a restore must refuse (ErrBadArchive) without a change.
type Hostile struct {
	Name string
	Tar  []byte
}

// Hostiles are the hostile archives: outside is a directory beside the volume
// that must stay empty, good a valid archive (cut in two for a truncated one).
func Hostiles(t *testing.T, outside string, good []byte) []Hostile {
	t.Helper()
	tarOf := func(entries ...tar.Header) []byte { return TarOf(t, entries...) }
	return []Hostile{
		{"dot-dot", tarOf(tar.Header{Name: "ok", Typeflag: tar.TypeReg, Linkname: "fine"}, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Linkname: "escaped"})},
		{"dot-dot inside", tarOf(tar.Header{Name: "a/../../x", Typeflag: tar.TypeReg, Linkname: "escaped"})},
		{"absolute", tarOf(tar.Header{Name: outside + "/x", Typeflag: tar.TypeReg, Linkname: "escaped"})},
		{"through a symlink", tarOf(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Linkname: "escaped"})},
		{"through a relative symlink", tarOf(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../../" + outside},
			tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Linkname: "escaped"})},
		{"symlink without a target", tarOf(tar.Header{Name: "l", Typeflag: tar.TypeSymlink})},
		{"hard link out", tarOf(tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"})},
		{"hard link up", tarOf(tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../volume/b"})},
		{"hard link through a symlink", tarOf(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "l/passwd"})},
		{"hard link to a later file", tarOf(tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "f"}, tar.Header{Name: "f", Typeflag: tar.TypeReg})},
		{"device node", tarOf(tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3})},
		{"block device", tarOf(tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8})},
		{"fifo", tarOf(tar.Header{Name: "p", Typeflag: tar.TypeFifo})},
		{"file then a directory of its name", tarOf(tar.Header{Name: "f", Typeflag: tar.TypeReg}, tar.Header{Name: "f/", Typeflag: tar.TypeDir})},
		{"not a tar", []byte("this is not an archive: " + strings.Repeat("x", 600))},
		{"truncated", good[:len(good)/2]},
		{"empty", nil},
	}
}
