package gitserver_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// hashObject writes raw bytes as an object of type typ with the real git, as given
// (--literally: git checks nothing), and returns its id.
func hashObject(t testing.TB, dir, typ string, data []byte) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "-t", typ, "--literally", "-w", "--stdin")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git hash-object: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// rawTree is the bytes of a tree of entries {mode, name, id}, in the order given.
func rawTree(t testing.TB, entries ...[3]string) []byte {
	t.Helper()
	list := make([]testenv.TreeEntry, len(entries))
	for i, e := range entries {
		list[i] = testenv.TreeEntry{Mode: e[0], Name: e[1], ID: e[2]}
	}
	return testenv.RawTree(t, list...)
}

// craftedCommit commits tree on top of main (raw, for a malformed commit when
// body is given) and points main at it.
func craftedCommit(t testing.TB, u *user, dir, tree string) string {
	t.Helper()
	parent := strings.TrimSpace(u.mustGit(dir, "rev-parse", "main"))
	commit := strings.TrimSpace(u.mustGit(dir, "commit-tree", tree, "-p", parent, "-m", "crafted"))
	u.mustGit(dir, "update-ref", "refs/heads/main", commit)
	return commit
}

func TestPushesThatGitFsckRefusesAreRefusedBeforeAnyBuild(t *testing.T) {
	e := newEnv(t)
	u := e.addUser("attacker", appv1.RoleMember, true)
	dir := u.workdir("fsckd")
	u.mustGit(dir, "push", "-q", "bex", "main")
	good := e.remoteRef("fsckd", "refs/heads/main")
	if good == "" || len(e.builder.all()) != 1 {
		t.Fatalf("the first push did not deploy: ref %q, %d builds", good, len(e.builder.all()))
	}

	file := hashObject(t, dir, "blob", []byte("* * * * * root touch /tmp/pwned\n"))
	sub := hashObject(t, dir, "tree", rawTree(t, [3]string{"100644", "x", file}))
	link := func(target string) string { return hashObject(t, dir, "blob", []byte(target)) }
	zeroPaddedSub := hashObject(t, dir, "tree", rawTree(t, [3]string{"100644", "x", file}))

	type tc struct {
		name string
		// object returns the object named in the refusal and the commit to push.
		object func() (bad, commit string)
		rule   string
	}
	treeCase := func(name, rule string, entries ...[3]string) tc {
		return tc{name: name, rule: rule, object: func() (string, string) {
			tree := hashObject(t, dir, "tree", rawTree(t, entries...))
			return tree, craftedCommit(t, u, dir, tree)
		}}
	}
	cases := []tc{
		treeCase("symlink and directory a, absolute target", "duplicateEntries: contains duplicate file entries",
			[3]string{"120000", "a", link("/etc/cron.d")}, [3]string{"40000", "a", sub}),
		treeCase("symlink and directory a, relative target", "duplicateEntries: contains duplicate file entries",
			[3]string{"120000", "a", link("../../../../etc/cron.d")}, [3]string{"40000", "a", sub}),
		treeCase("two files of one name", "duplicateEntries: contains duplicate file entries",
			[3]string{"100644", "a", file}, [3]string{"100644", "a", file}),
		treeCase("unsorted", "treeNotSorted: not properly sorted",
			[3]string{"100644", "b", file}, [3]string{"100644", "a", file}),
		treeCase(".git", "hasDotgit: contains '.git'", [3]string{"40000", ".git", sub}),
		treeCase(".GIT", "hasDotgit: contains '.git'", [3]string{"40000", ".GIT", sub}),
		treeCase(".git. (NTFS)", "hasDotgit: contains '.git'", [3]string{"40000", ".git.", sub}),
		treeCase(".git followed by spaces (NTFS)", "hasDotgit: contains '.git'", [3]string{"40000", ".git  ", sub}),
		treeCase("git~1 (NTFS short name)", "hasDotgit: contains '.git'", [3]string{"40000", "git~1", sub}),
		treeCase(".g\u200cit (HFS+)", "hasDotgit: contains '.git'", [3]string{"40000", ".g\u200cit", sub}),
		treeCase("..", "hasDotdot: contains '..'", [3]string{"40000", "..", sub}),
		treeCase("mode 100664", "badFilemode: contains bad file modes", [3]string{"100664", "a", file}),
		treeCase("mode 100600", "badFilemode: contains bad file modes", [3]string{"100600", "a", file}),
		treeCase("zero-padded mode", "zeroPaddedFilemode: contains zero-padded file modes", [3]string{"040000", "a", zeroPaddedSub}),
		{name: "nested .git under a directory", rule: "hasDotgit: contains '.git'", object: func() (string, string) {
			inner := hashObject(t, dir, "tree", rawTree(t, [3]string{"100644", "config", file}))
			bad := hashObject(t, dir, "tree", rawTree(t, [3]string{"40000", ".Git", inner}))
			root := hashObject(t, dir, "tree", rawTree(t, [3]string{"40000", "vendor", bad}))
			return bad, craftedCommit(t, u, dir, root)
		}},
		{name: "commit without author", rule: "missingAuthor: invalid format - expected 'author' line", object: func() (string, string) {
			parent := strings.TrimSpace(u.mustGit(dir, "rev-parse", "main"))
			c := hashObject(t, dir, "commit", []byte("tree "+sub+"\nparent "+parent+"\ncommitter A <a@b> 1700000000 +0000\n\nno author\n"))
			u.mustGit(dir, "update-ref", "refs/heads/main", c)
			return c, c
		}},
		{name: "commit with a bad date", rule: "badDate: invalid author/committer line - bad date", object: func() (string, string) {
			parent := strings.TrimSpace(u.mustGit(dir, "rev-parse", "main"))
			c := hashObject(t, dir, "commit", []byte("tree "+sub+"\nparent "+parent+"\nauthor A <a@b> yesterday +0000\ncommitter A <a@b> 1700000000 +0000\n\nm\n"))
			u.mustGit(dir, "update-ref", "refs/heads/main", c)
			return c, c
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u.mustGit(dir, "update-ref", "refs/heads/main", good)
			bad, _ := c.object()
			line := "object " + bad[:7] + ": " + c.rule
			out, err := u.git(dir, "push", "bex", "main")
			if err == nil {
				t.Fatalf("push accepted:\n%s", out)
			}
			t.Logf("git push:\n%s", out)
			if !strings.Contains(out, "! [remote rejected] main -> main ("+line+")") || !strings.Contains(out, "remote:  !     "+line) {
				t.Fatalf("want the refusal %q on the ref and a remote: line, got:\n%s", line, out)
			}
			if got := e.remoteRef("fsckd", "refs/heads/main"); got != good {
				t.Fatalf("main moved to %s", got)
			}
			if n := len(e.builder.all()); n != 1 {
				t.Fatalf("%d builds, want only the first push's", n)
			}
		})
	}
	// Nothing of the refused pushes was kept: only the first push's pack.
	packs, _ := filepath.Glob(filepath.Join(e.repoDir("fsckd"), "objects", "pack", "*.pack"))
	if len(packs) != 1 {
		t.Fatalf("packs in the repository: %v", packs)
	}
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Fatal("/tmp/pwned exists")
	}
}
