package receive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// git runs the real git in dir and returns its trimmed output.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=bex", "GIT_AUTHOR_EMAIL=bex@example.com",
		"GIT_COMMITTER_NAME=bex", "GIT_COMMITTER_EMAIL=bex@example.com", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// workTree makes a repository with n commits on main and returns its directory.
func workTree(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	git(t, dir, "init", "-q", "-b", "main")
	for i := 0; i < n; i++ {
		// A large file that changes by one line per commit, so that git sends deltas.
		content := strings.Repeat("the same line in every version of the file\n", 400) + fmt.Sprintf("version %d\n", i)
		if err := os.WriteFile(filepath.Join(dir, "file.txt"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, dir, "add", ".")
		git(t, dir, "commit", "-q", "-m", fmt.Sprintf("commit %d", i))
	}
	return dir
}

// packOf runs git pack-objects for revs (e.g. "main", "^<old>") as a push would.
func packOf(t testing.TB, dir string, thin bool, revs ...string) []byte {
	t.Helper()
	args := []string{"pack-objects", "--stdout", "--revs", "--delta-base-offset", "-q"}
	if thin {
		args = append(args, "--thin")
	}
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(strings.Join(revs, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pack-objects: %v", err)
	}
	return out
}

func TestStorePackThenUpdateRefGivesAValidRepository(t *testing.T) {
	src := workTree(t, 5)
	repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := git(t, src, "rev-parse", "main~2")
	p, err := repo.StorePack(ctx, bytes.NewReader(packOf(t, src, false, first)), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Objects == 0 || p.Completed != 0 {
		t.Fatalf("first pack: %+v", p)
	}
	// The objects are stored but no ref moved yet.
	if refs, _ := repo.Refs(); len(refs) != 0 {
		t.Fatalf("refs before UpdateRef: %v", refs)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", New: plumbing.NewHash(first)}); err != nil {
		t.Fatal(err)
	}

	// Two more commits as a thin pack against what the repository has.
	tip := git(t, src, "rev-parse", "main")
	p, err = repo.StorePack(ctx, bytes.NewReader(packOf(t, src, true, tip, "^"+first)), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Completed == 0 {
		t.Fatalf("expected a thin pack completed from the repository, got %+v", p)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", Old: plumbing.NewHash(first), New: plumbing.NewHash(tip)}); err != nil {
		t.Fatal(err)
	}
	git(t, repo.Dir, "fsck", "--strict", "--no-dangling")
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, t.TempDir(), "clone", "-q", repo.Dir, clone)
	if got := git(t, clone, "rev-parse", "HEAD"); got != tip {
		t.Fatalf("clone HEAD %s, want %s", got, tip)
	}
}

func TestUpdateRefIsCompareAndSwap(t *testing.T) {
	src := workTree(t, 2)
	repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
	if err != nil {
		t.Fatal(err)
	}
	tip := plumbing.NewHash(git(t, src, "rev-parse", "main"))
	parent := plumbing.NewHash(git(t, src, "rev-parse", "main~1"))
	if _, err := repo.StorePack(context.Background(), bytes.NewReader(packOf(t, src, false, tip.String())), Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", New: parent}); err != nil {
		t.Fatal(err)
	}
	// A stale old value is refused and changes nothing.
	err = repo.UpdateRef(Command{Name: "refs/heads/main", Old: tip, New: tip})
	if !errors.Is(err, ErrStale) {
		t.Fatalf("stale update: %v", err)
	}
	if got, _ := repo.Ref("refs/heads/main"); got != parent {
		t.Fatalf("ref moved to %s after a refused update", got)
	}
	// A lock file left by a crash does not wedge the ref.
	if err := os.WriteFile(filepath.Join(repo.Dir, "refs/heads/main.lock"), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", Old: parent, New: tip}); err != nil {
		t.Fatal(err)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", Old: tip}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got, _ := repo.Ref("refs/heads/main"); !got.IsZero() {
		t.Fatalf("deleted ref still at %s", got)
	}
}

func TestStorePackRejectsBadInputAndKeepsNothing(t *testing.T) {
	src := workTree(t, 3)
	good := packOf(t, src, false, "main")
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)/2] ^= 0xff
	thinWithoutBase := packOf(t, src, true, "main", "^main~1")
	cases := map[string]struct {
		pack  []byte
		limit int64
		want  string
	}{
		"truncated":            {good[:len(good)/2], 0, "reading"},
		"corrupt":              {corrupt, 0, ""},
		"not a pack":           {[]byte("hello, this is not a pack at all"), 0, "pack header"},
		"too large":            {good, int64(len(good) / 2), "pack too large"},
		"thin, base not there": {thinWithoutBase, 0, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
			if err != nil {
				t.Fatal(err)
			}
			_, err = repo.StorePack(context.Background(), bytes.NewReader(tc.pack), Limits{MaxPackBytes: tc.limit})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
			left, _ := filepath.Glob(filepath.Join(repo.Dir, "objects/pack/*"))
			if len(left) != 0 {
				t.Fatalf("files left behind: %v", left)
			}
		})
	}
}

func TestReadRequest(t *testing.T) {
	old := strings.Repeat("a", 40)
	nw := strings.Repeat("b", 40)
	zero := strings.Repeat("0", 40)
	pkt := func(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }
	in := pkt(old+" "+nw+" refs/heads/main\x00report-status side-band-64k push-options agent=git/2.39\n") +
		pkt(zero+" "+nw+" refs/tags/v1\n") + "0000" +
		pkt("no-cache\n") + pkt("async") + "0000" + "PACK"
	r := strings.NewReader(in)
	req, err := ReadRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Commands) != 2 || req.Commands[0].Name != "refs/heads/main" || !req.Commands[1].IsCreate() {
		t.Fatalf("commands: %+v", req.Commands)
	}
	if strings.Join(req.Options, ",") != "no-cache,async" {
		t.Fatalf("options: %q", req.Options)
	}
	if !req.HasPack() {
		t.Fatal("HasPack = false")
	}
	rest := make([]byte, 10)
	n, _ := r.Read(rest)
	if string(rest[:n]) != "PACK" {
		t.Fatalf("ReadRequest read into the pack: %q left", rest[:n])
	}

	if _, err := ReadRequest(strings.NewReader("0000")); !errors.Is(err, ErrNoCommands) {
		t.Fatalf("flush only: %v", err)
	}
	bad := map[string]string{
		"outside refs": pkt(old + " " + nw + " HEAD\x00report-status\n"),
		"dot dot":      pkt(old + " " + nw + " refs/heads/../../config\x00\n"),
		"short hash":   pkt("abc " + nw + " refs/heads/main\x00\n"),
		"bad hex":      pkt(strings.Repeat("g", 40) + " " + nw + " refs/heads/main\x00\n"),
		"shallow":      pkt("shallow " + old + "\n"),
		"truncated":    pkt(old + " " + nw + " refs/heads/main\x00\n"),
		"bad length":   "zzzz",
	}
	for name, in := range bad {
		if _, err := ReadRequest(strings.NewReader(in)); err == nil {
			t.Errorf("%s: accepted %q", name, in)
		}
	}
}

// FuzzReadRequest: arbitrary input is an error or a request, never a panic or a
// hang. Seeds are in testdata/fuzz/FuzzReadRequest.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte("0000"))
	f.Add([]byte("00a0" + strings.Repeat("a", 40) + " " + strings.Repeat("b", 40) + " refs/heads/main\x00report-status push-options\n0000"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ReadRequest(bytes.NewReader(data))
		if err == nil && len(req.Commands) == 0 {
			t.Fatal("a request without commands and without an error")
		}
	})
}

func TestStorePackRefusesAPackWithDanglingReferences(t *testing.T) {
	src := t.TempDir()
	git(t, src, "init", "-q", "-b", "main")
	missing := strings.Repeat("ab", 20)
	cmd := exec.Command("git", "mktree", "--missing")
	cmd.Dir = src
	cmd.Stdin = strings.NewReader("100644 blob " + missing + "\tghost.txt\n")
	tree, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	commit := git(t, src, "commit-tree", strings.TrimSpace(string(tree)), "-m", "points at nothing")
	pack := exec.Command("git", "pack-objects", "--stdout", "--revs", "--missing=allow-any", "-q")
	pack.Dir = src
	pack.Stdin = strings.NewReader(commit + "\n")
	data, err := pack.Output()
	if err != nil {
		t.Fatal(err)
	}
	repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
	if err != nil {
		t.Fatal(err)
	}
	_, err = repo.StorePack(context.Background(), bytes.NewReader(data), Limits{})
	if err == nil || !strings.Contains(err.Error(), "refers to "+missing) {
		t.Fatalf("want a connectivity error naming %s, got %v", missing, err)
	}
	if left, _ := filepath.Glob(filepath.Join(repo.Dir, "objects/pack/*")); len(left) != 0 {
		t.Fatalf("a refused pack was kept: %v", left)
	}
}

// TestCheckCommandOnTheObjectsOfAStoredPack: a branch may point at a pushed
// commit, not at a pushed tree (a tag may); an id that is nowhere is missing. The
// tips' types come from the store itself, and from the repository for the others.
func TestCheckCommandOnTheObjectsOfAStoredPack(t *testing.T) {
	src := workTree(t, 2)
	repo := emptyRepo(t)
	commit := plumbing.NewHash(git(t, src, "rev-parse", "main"))
	tree := plumbing.NewHash(git(t, src, "rev-parse", "main^{tree}"))
	parent := plumbing.NewHash(git(t, src, "rev-parse", "main~1"))
	if _, err := repo.StorePack(context.Background(), bytes.NewReader(packOf(t, src, false, "main")), Limits{Tips: []plumbing.Hash{commit, tree}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Repo{repo, {Dir: repo.Dir}} { // the Repo that stored, and a fresh one
		if err := r.CheckCommand(Command{Name: "refs/heads/main", New: commit}); err != nil {
			t.Errorf("branch to the pushed commit: %v", err)
		}
		if err := r.CheckCommand(Command{Name: "refs/heads/main", New: parent}); err != nil {
			t.Errorf("branch to a commit that is not a tip: %v", err)
		}
		if err := r.CheckCommand(Command{Name: "refs/heads/main", New: tree}); err == nil || err.Error() != "main would point at a tree, not a commit" {
			t.Errorf("branch to a tree: %v", err)
		}
		if err := r.CheckCommand(Command{Name: "refs/tags/v1", New: tree}); err != nil {
			t.Errorf("tag to a tree: %v", err)
		}
		ghost := plumbing.NewHash(strings.Repeat("ab", 20))
		if err := r.CheckCommand(Command{Name: "refs/heads/main", New: ghost}); err == nil || !strings.Contains(err.Error(), "is missing") {
			t.Errorf("branch to nothing: %v", err)
		}
	}
}
