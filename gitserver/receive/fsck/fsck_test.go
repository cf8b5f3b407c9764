package fsck

import (
	"errors"
	"strings"
	"testing"
)

type ent struct {
	mode, name string
}

// tree builds raw tree bytes with ids of 0x11.
func tree(es ...ent) []byte {
	var b []byte
	for _, e := range es {
		b = append(b, e.mode+" "+e.name+"\x00"...)
		b = append(b, strings.Repeat("\x11", 20)...)
	}
	return b
}

func wantID(t *testing.T, err error, id string) {
	t.Helper()
	if id == "" {
		if err != nil {
			t.Fatalf("got %v, want no error", err)
		}
		return
	}
	var fe *Error
	if !errors.As(err, &fe) || fe.ID != id {
		t.Fatalf("got %v, want %s", err, id)
	}
}

var treeCases = []struct {
	name string
	data []byte
	want string
}{
	{"valid", tree(ent{"100644", "a"}, ent{"40000", "b"}, ent{"120000", "c"}, ent{"100755", "d"}, ent{"160000", "e"}), ""},
	{"empty tree", nil, ""},
	{"blob and tree of one name", tree(ent{"120000", "a"}, ent{"40000", "a"}), "duplicateEntries"},
	{"two blobs of one name", tree(ent{"100644", "a"}, ent{"100644", "a"}), "duplicateEntries"},
	{"two trees of one name", tree(ent{"40000", "a"}, ent{"40000", "a"}), "duplicateEntries"},
	{"blob and tree apart", tree(ent{"100644", "foo"}, ent{"100644", "foo.bar"}, ent{"40000", "foo"}), "duplicateEntries"},
	{"blob, blob.x, tree.x/, tree/", tree(ent{"100644", "foo"}, ent{"100644", "foo.bar"}, ent{"100644", "foo.bar.baz"}, ent{"40000", "foo.bar"}, ent{"40000", "foo"}), "duplicateEntries"},
	{"tree sorts as name/", tree(ent{"100644", "a.b"}, ent{"40000", "a"}), ""},
	{"blob before a.b", tree(ent{"100644", "a"}, ent{"100644", "a.b"}), ""},
	{"tree before a.b", tree(ent{"40000", "a"}, ent{"100644", "a.b"}), "treeNotSorted"},
	{"unsorted", tree(ent{"100644", "b"}, ent{"100644", "a"}), "treeNotSorted"},
	{"empty name", tree(ent{"100644", ""}), "emptyName"},
	{"slash", tree(ent{"100644", "a/b"}), "fullPathname"},
	{"dot", tree(ent{"40000", "."}), "hasDot"},
	{"dotdot", tree(ent{"40000", ".."}), "hasDotdot"},
	{".git", tree(ent{"40000", ".git"}), "hasDotgit"},
	{".GIT", tree(ent{"40000", ".GIT"}), "hasDotgit"},
	{".Git", tree(ent{"100644", ".Git"}), "hasDotgit"},
	{".git.", tree(ent{"40000", ".git."}), "hasDotgit"},
	{".git trailing spaces", tree(ent{"40000", ".git  "}), "hasDotgit"},
	{".git. .", tree(ent{"40000", ".git. ."}), "hasDotgit"},
	{"git~1", tree(ent{"40000", "git~1"}), "hasDotgit"},
	{"GIT~1", tree(ent{"40000", "GIT~1"}), "hasDotgit"},
	{"HFS ZWNJ", tree(ent{"40000", ".g\u200cit"}), "hasDotgit"},
	{"HFS BOM", tree(ent{"40000", "\ufeff.GIT"}), "hasDotgit"},
	{"HFS RLO at end", tree(ent{"40000", ".git\u202e"}), "hasDotgit"},
	{"NTFS ADS", tree(ent{"40000", ".git::$INDEX_ALLOCATION"}), "hasDotgit"},
	{"backslash component", tree(ent{"100644", "a\\.git\\hooks"}), "hasDotgit"},
	{".gitignore is fine", tree(ent{"100644", ".gitignore"}), ""},
	{".github is fine", tree(ent{"40000", ".github"}), ""},
	{".gitx is fine", tree(ent{"40000", ".gitx"}), ""},
	{"git~2 is fine", tree(ent{"40000", "git~2"}), ""},
	{"invalid UTF-8 is not .git", tree(ent{"100644", ".g\xffit"}), ""},
	{"zero-padded mode", tree(ent{"040000", "a"}), "zeroPaddedFilemode"},
	{"zero-padded file", tree(ent{"0100644", "a"}), "zeroPaddedFilemode"},
	{"mode 100664", tree(ent{"100664", "a"}), "badFilemode"},
	{"mode 100600", tree(ent{"100600", "a"}), "badFilemode"},
	{"mode 777", tree(ent{"777", "a"}), "badFilemode"},
	{"mode 140000", tree(ent{"140000", "a"}), "badFilemode"},
	{"null id", append([]byte("100644 a\x00"), make([]byte, 20)...), "nullSha1"},
	{"gitmodules link", tree(ent{"120000", ".gitmodules"}), "gitmodulesSymlink"},
	{"gitmodules short link", tree(ent{"120000", "GITMOD~1"}), "gitmodulesSymlink"},
	{"truncated id", []byte("100644 a\x00\x11\x11"), "badTree"},
	{"no NUL", []byte("100644 a"), "badTree"},
	{"non-octal mode", tree(ent{"100648", "a"}), "badTree"},
	{"no mode", tree(ent{"", "a"}), "badTree"},
	{"garbage", []byte("hello world\n"), "badTree"},
}

func TestTrees(t *testing.T) {
	for _, c := range treeCases {
		t.Run(c.name, func(t *testing.T) {
			wantID(t, CheckTree(strings.Repeat("ab", 20), c.data, nil), c.want)
		})
	}
}

const (
	h1    = "1111111111111111111111111111111111111111"
	h2    = "2222222222222222222222222222222222222222"
	ident = "A U Thor <a@example.com> 1700000000 +0000\n"
)

const goodCommit = "tree " + h1 + "\nparent " + h2 + "\nauthor " + ident + "committer " + ident + "\nmessage\n"

var commitCases = []struct {
	name, data, want string
}{
	{"valid", goodCommit, ""},
	{"no body", "tree " + h1 + "\nauthor " + ident + "committer " + ident, ""},
	{"extra headers", "tree " + h1 + "\nauthor " + ident + "committer " + ident + "encoding UTF-8\ngpgsig x\n \n\nm\n", ""},
	{"no tree", "parent " + h1 + "\nauthor " + ident + "committer " + ident, "missingTree"},
	{"bad tree id", "tree 1234\nauthor " + ident + "committer " + ident, "badTreeSha1"},
	{"tree id not hex", "tree " + strings.Repeat("z", 40) + "\nauthor " + ident + "committer " + ident, "badTreeSha1"},
	{"bad parent", "tree " + h1 + "\nparent x\nauthor " + ident + "committer " + ident, "badParentSha1"},
	{"no author", "tree " + h1 + "\ncommitter " + ident, "missingAuthor"},
	{"two authors", "tree " + h1 + "\nauthor " + ident + "author " + ident + "committer " + ident, "multipleAuthors"},
	{"no committer", "tree " + h1 + "\nauthor " + ident + "\nm\n", "missingCommitter"},
	{"no name", "tree " + h1 + "\nauthor <a@b> 1 +0000\ncommitter " + ident, "missingNameBeforeEmail"},
	{"bad name", "tree " + h1 + "\nauthor A> <a@b> 1 +0000\ncommitter " + ident, "badName"},
	{"no email", "tree " + h1 + "\nauthor A 1 +0000\ncommitter " + ident, "missingEmail"},
	{"no space before email", "tree " + h1 + "\nauthor A<a@b> 1 +0000\ncommitter " + ident, "missingSpaceBeforeEmail"},
	{"bad email", "tree " + h1 + "\nauthor A <a@b 1 +0000\ncommitter " + ident, "badEmail"},
	{"no space before date", "tree " + h1 + "\nauthor A <a@b>1 +0000\ncommitter " + ident, "missingSpaceBeforeDate"},
	{"zero-padded date", "tree " + h1 + "\nauthor A <a@b> 01 +0000\ncommitter " + ident, "zeroPaddedDate"},
	{"zero date", "tree " + h1 + "\nauthor A <a@b> 0 +0000\ncommitter " + ident, ""},
	{"bad date", "tree " + h1 + "\nauthor A <a@b> x +0000\ncommitter " + ident, "badDate"},
	{"date overflow", "tree " + h1 + "\nauthor A <a@b> 99999999999999999999999 +0000\ncommitter " + ident, "badDateOverflow"},
	{"bad zone", "tree " + h1 + "\nauthor A <a@b> 1 +000\ncommitter " + ident, "badTimezone"},
	{"zone without sign", "tree " + h1 + "\nauthor A <a@b> 1 0000\ncommitter " + ident, "badTimezone"},
	{"committer at end without newline", "tree " + h1 + "\nauthor " + ident + "committer A <a@b> 1 +0000", "unterminatedHeader"},
	{"NUL in header", "tree " + h1 + "\nauthor A\x00 <a@b> 1 +0000\ncommitter " + ident, "nulInHeader"},
	{"NUL in body", goodCommit + "\x00", "nulInCommit"},
	{"empty", "", "unterminatedHeader"},
}

func TestCommits(t *testing.T) {
	for _, c := range commitCases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CheckCommit(strings.Repeat("ab", 20), []byte(c.data))
			wantID(t, err, c.want)
		})
	}
}

func TestTags(t *testing.T) {
	for _, c := range []struct {
		name, data, want string
	}{
		{"valid", "object " + h1 + "\ntype commit\ntag v1\ntagger " + ident + "\nmsg\n", ""},
		{"early tag without tagger", "object " + h1 + "\ntype commit\ntag v1\n\nmsg\n", ""},
		{"no object", "type commit\ntag v1\n", "missingObject"},
		{"bad object", "object 12\ntype commit\ntag v1\n", "badObjectSha1"},
		{"no type", "object " + h1 + "\ntag v1\n", "missingTypeEntry"},
		{"bad type", "object " + h1 + "\ntype car\ntag v1\n", "badType"},
		{"no tag", "object " + h1 + "\ntype commit\n", "missingTagEntry"},
		{"bad tagger", "object " + h1 + "\ntype commit\ntag v1\ntagger A <a@b> x +0000\n", "badDate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := CheckTag(strings.Repeat("ab", 20), []byte(c.data))
			wantID(t, err, c.want)
		})
	}
}

func TestErrorLine(t *testing.T) {
	err := CheckTree("3f2a1c7aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", tree(ent{"100644", "a"}, ent{"40000", "a"}), nil)
	if got, want := err.Error(), "object 3f2a1c7: duplicateEntries: contains duplicate file entries"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// FuzzCheck: no input panics, and a tree that passes has entries that an export
// may write as they are: unique, sorted names without '/', ".", ".." or ".git".
func FuzzCheck(f *testing.F) {
	f.Add(2, tree(ent{"120000", "a"}, ent{"40000", "a"}))
	f.Add(2, tree(ent{"100644", ".git."}))
	f.Add(1, []byte("tree "+h1+"\nauthor "+ident+"committer "+ident))
	f.Add(4, []byte("object "+h1+"\ntype commit\ntag v1\n"))
	f.Fuzz(func(t *testing.T, typ int, data []byte) {
		_ = Check(Type(typ), h1, data)
		seen := map[string]bool{}
		_ = CheckTree(h1, data, func(e Entry) {
			n := string(e.Name)
			if n == "" || n == "." || n == ".." || strings.Contains(n, "/") || strings.EqualFold(n, ".git") || seen[n] {
				t.Fatalf("tree passed with entry %q (seen %v)", n, seen[n])
			}
			seen[n] = true
		})
	})
}
