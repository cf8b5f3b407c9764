package builder

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"bex.co/bex/internal/testenv"
)

// gitRepo is a bare repository where trees are written by hand with the real git
// (hash-object --literally), as an attacker would, including trees git itself would
// refuse.
type gitRepo struct {
	t   *testing.T
	dir string
}

func newGitRepo(t *testing.T) *gitRepo {
	g := &gitRepo{t: t, dir: t.TempDir()}
	g.run(nil, "init", "-q", "--bare")
	return g
}

func (g *gitRepo) run(stdin []byte, args ...string) string {
	g.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = g.dir
	cmd.Env = append(os.Environ(), "HOME="+g.dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co")
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.Output()
	if err != nil {
		g.t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

func (g *gitRepo) blob(content string) string {
	return g.run([]byte(content), "hash-object", "-w", "--stdin")
}

// entry is one tree entry: mode (as git writes it, e.g. 100644, 40000, 120000),
// name and object id.
type entry = testenv.TreeEntry

// tree writes the entries as they are given: unsorted and duplicate entries too.
func (g *gitRepo) tree(entries ...entry) string {
	return g.run(testenv.RawTree(g.t, entries...), "hash-object", "-w", "-t", "tree", "--literally", "--stdin")
}

func (g *gitRepo) commit(tree string) string {
	return g.run(nil, "commit-tree", tree, "-m", "crafted")
}

var defaultLimits = exportLimits{maxBytes: 1 << 30, maxFiles: 100_000}

// hostTarget is a directory outside the export that a link in a tree points at; the
// test fails if anything is ever written there.
func hostTarget(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte("host file"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func assertUntouched(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "marker" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the host directory %s was written to: %v", dir, names)
	}
}

func TestExportRefusesALinkAndADirectoryOfOneName(t *testing.T) {
	g := newGitRepo(t)
	host := hostTarget(t)
	file := g.blob("written through the link\n")
	inner := g.tree(entry{Mode: "100644", Name: "x", ID: file})
	for _, tc := range []struct {
		name, target string
		linkFirst    bool
	}{
		{"absolute target, link first", host, true},
		{"absolute target, directory first", host, false},
		{"relative target, link first", "", true},
		{"relative target, directory first", "", false},
		{"target inside the tree", ".", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "export")
			target := tc.target
			if target == "" {
				// ../../..: from the link (out/a) up and down to the host directory.
				rel, err := filepath.Rel(out, host)
				if err != nil {
					t.Fatal(err)
				}
				target = rel
			}
			link := entry{Mode: "120000", Name: "a", ID: g.blob(target)}
			dir := entry{Mode: "40000", Name: "a", ID: inner}
			entries := []entry{dir, link}
			if tc.linkFirst {
				entries = []entry{link, dir}
			}
			commit := g.commit(g.tree(entries...))
			_, err := exportCommit(context.Background(), g.dir, commit, out, defaultLimits)
			if !errors.Is(err, ErrUnsafeTree) || !strings.Contains(err.Error(), `holds "a" twice; rewrite the commit with git`) {
				t.Fatalf("err = %v", err)
			}
			assertUntouched(t, host)
			// Nothing was written beside the export either.
			if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
				t.Fatalf("the export's parent holds %d entries", len(entries))
			}
		})
	}
}

func TestExportRefusesNamesThatAreNotFileNames(t *testing.T) {
	g := newGitRepo(t)
	file := g.blob("x\n")
	for _, tc := range []struct {
		name  string
		entry entry
		want  string
	}{
		// go-git's tree walker refuses these itself; the export would too.
		{"dot-dot", entry{Mode: "100644", Name: "..", ID: file}, `invalid path ".."`},
		{"dot", entry{Mode: "100644", Name: ".", ID: file}, `invalid path "."`},
		{"slash", entry{Mode: "100644", Name: "etc/passwd", ID: file}, `holds the path "etc/passwd", which is not a file name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			commit := g.commit(g.tree(tc.entry))
			_, err := exportCommit(context.Background(), g.dir, commit, filepath.Join(t.TempDir(), "export"), defaultLimits)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestExportWritesLinksWithoutFollowingThem(t *testing.T) {
	g := newGitRepo(t)
	host := hostTarget(t)
	commit := g.commit(g.tree(
		entry{Mode: "100644", Name: "a.txt", ID: g.blob("a\n")},
		entry{Mode: "120000", Name: "etc", ID: g.blob(host)},
		entry{Mode: "100755", Name: "run.sh", ID: g.blob("#!/bin/sh\n")},
		entry{Mode: "40000", Name: "sub", ID: g.tree(entry{Mode: "120000", Name: "up", ID: g.blob("../../..")})},
	))
	out := filepath.Join(t.TempDir(), "export")
	n, err := exportCommit(context.Background(), g.dir, commit, out, defaultLimits)
	if err != nil || n != int64(len("a\n")+len("#!/bin/sh\n")) {
		t.Fatalf("export: %d, %v", n, err)
	}
	if target, err := os.Readlink(filepath.Join(out, "etc")); err != nil || target != host {
		t.Fatalf("etc -> %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(out, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh: %v, %v", fi, err)
	}
	assertUntouched(t, host)
}

func TestExportBoundsTheNumberOfFiles(t *testing.T) {
	g := newGitRepo(t)
	file := g.blob("x\n")
	var entries []entry
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		entries = append(entries, entry{Mode: "100644", Name: name, ID: file})
	}
	commit := g.commit(g.tree(entries...))
	_, err := exportCommit(context.Background(), g.dir, commit, filepath.Join(t.TempDir(), "export"), exportLimits{maxBytes: 1 << 20, maxFiles: 5})
	if !errors.Is(err, ErrContextTooLarge) || !strings.Contains(err.Error(), "has more than 5 files and directories, the limit of a build context") {
		t.Fatalf("err = %v", err)
	}
	if _, err := exportCommit(context.Background(), g.dir, commit, filepath.Join(t.TempDir(), "export"), exportLimits{maxBytes: 1 << 20, maxFiles: 6}); err != nil {
		t.Fatalf("6 files within a limit of 6: %v", err)
	}
}

// cancelAfter is a context that reports itself cancelled from the nth call of Err
// on: the export checks between entries and between chunks of a copy, so the test
// can stop it in the middle of a large file without racing it.
type cancelAfter struct {
	context.Context
	calls, n atomic.Int64
}

func (c *cancelAfter) Err() error {
	if c.calls.Add(1) >= c.n.Load() {
		return context.Canceled
	}
	return nil
}

func TestExportStopsWhenCancelled(t *testing.T) {
	g := newGitRepo(t)
	big := g.blob(strings.Repeat("0123456789abcdef", 1<<20)) // 16 MiB
	commit := g.commit(g.tree(entry{Mode: "100644", Name: "big", ID: big}, entry{Mode: "100644", Name: "small", ID: g.blob("s\n")}))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(t.TempDir(), "export")
	if _, err := exportCommit(ctx, g.dir, commit, out, defaultLimits); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before: %v", err)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Fatalf("a cancelled export wrote %d entries", len(entries))
	}

	// Cancelled a few chunks into the 16 MiB file: the copy stops there.
	c := &cancelAfter{Context: context.Background()}
	c.n.Store(5)
	out = filepath.Join(t.TempDir(), "export")
	if _, err := exportCommit(c, g.dir, commit, out, defaultLimits); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled during the copy: %v", err)
	}
	fi, err := os.Stat(filepath.Join(out, "big"))
	if err != nil || fi.Size() >= 16<<20 {
		t.Fatalf("big: %v, %v: the copy went on after the cancellation", fi, err)
	}
	if _, err := os.Stat(filepath.Join(out, "small")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the entry after the cancellation was written: %v", err)
	}
}

// BenchmarkExport exports a commit of 5,000 small files in 50 directories: the cost
// of writing through an os.Root and checking each parent.
func BenchmarkExport(b *testing.B) {
	dir := b.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	run("init", "-q", "-b", "main")
	for d := range 50 {
		sub := filepath.Join(dir, "d"+strconv.Itoa(d))
		os.Mkdir(sub, 0o755)
		for f := range 100 {
			os.WriteFile(filepath.Join(sub, "f"+strconv.Itoa(f)), []byte("file "+strconv.Itoa(d*100+f)+"\n"), 0o644)
		}
	}
	run("add", "-A")
	run("commit", "-q", "-m", "many")
	head, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		b.Fatal(err)
	}
	commit := strings.TrimSpace(string(head))
	b.ResetTimer()
	for i := range b.N {
		if _, err := exportCommit(context.Background(), filepath.Join(dir, ".git"), commit, filepath.Join(b.TempDir(), "e"+strconv.Itoa(i)), defaultLimits); err != nil {
			b.Fatal(err)
		}
	}
}
