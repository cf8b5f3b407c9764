package testenv

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// FastImport makes a repository at dir (nothing checked out) and fills it with
// what write writes to `git fast-import`: large or many-object histories in
// seconds, for pushes and packs.
func FastImport(t testing.TB, dir string, write func(w *bufio.Writer)) {
	t.Helper()
	if out, err := exec.Command("git", "init", "-q", "-b", "main", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	fi := exec.Command("git", "fast-import", "--quiet")
	fi.Dir = dir
	stdin, err := fi.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	fi.Stderr = &stderr
	if err := fi.Start(); err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(stdin, 1<<20)
	write(w)
	flushErr := w.Flush()
	stdin.Close()
	if err := fi.Wait(); err != nil || flushErr != nil {
		t.Fatalf("fast-import: %v, %v\n%s", err, flushErr, stderr.String())
	}
}

// ManySmallFiles makes a repository at dir whose one commit on main holds n
// small files (each its own blob, a few dozen bytes) in directories of 1,000:
// the many-object push (a vendored tree) that a push's memory is measured with.
func ManySmallFiles(t testing.TB, dir string, n int) {
	t.Helper()
	FastImport(t, dir, func(w *bufio.Writer) {
		fmt.Fprintf(w, "commit refs/heads/main\ncommitter bex <test@bex.co> 1700000000 +0000\ndata 6\nmany.\n")
		for i := range n {
			content := fmt.Sprintf("file %d of %d: a small file, as a vendored tree has many\n", i, n)
			fmt.Fprintf(w, "M 644 inline d%04d/f%04d.txt\ndata %d\n%s\n", i/1000, i%1000, len(content), content)
		}
	})
}
