package fsck

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Type is a git object type, numbered as in a pack.
type Type int

// The object types that carry references.
const (
	Commit Type = 1
	Tree   Type = 2
	Blob   Type = 3
	Tag    Type = 4
)

// Error is one fsck finding: the object, git's message id, and git's text.
type Error struct {
	// Object is the object's id in hex.
	Object string
	// ID is git's message id (fsck.c's FSCK_MSG_* in camelCase: "duplicateEntries").
	ID string
	// Message is git's description ("contains duplicate file entries").
	Message string
}

// Error is the line git prints, with the id shortened as in a push's output.
func (e *Error) Error() string {
	id := e.Object
	if len(id) > 7 {
		id = id[:7]
	}
	return fmt.Sprintf("object %s: %s: %s", id, e.ID, e.Message)
}

// Entry is one tree entry.
type Entry struct {
	Mode uint32
	Name []byte
	ID   [20]byte
}

// IsDir reports whether the entry is a tree.
func (e Entry) IsDir() bool { return e.Mode == 0o40000 }

// IsGitlink reports whether the entry is a submodule commit.
func (e Entry) IsGitlink() bool { return e.Mode == 0o160000 }

// Check checks one object's content; id names it in the error. Blobs are not
// checked (git checks only .gitmodules and .gitattributes blobs, which bex does not
// use).
func Check(t Type, id string, data []byte) error {
	switch t {
	case Commit:
		_, err := CheckCommit(id, data)
		return err
	case Tree:
		return CheckTree(id, data, nil)
	case Tag:
		_, err := CheckTag(id, data)
		return err
	}
	return nil
}

func fail(id, msgID, msg string) *Error { return &Error{Object: id, ID: msgID, Message: msg} }

// ParseTree walks a tree's entries, calling fn for each, and fails on bytes that do
// not parse as a tree (git's decode_tree_entry). It checks nothing else.
func ParseTree(data []byte, fn func(Entry) error) error {
	return parseTree(data, func(e Entry, _ bool) error { return fn(e) })
}

// parseTree is ParseTree, also telling fn whether the entry's mode is written
// with a leading zero (which the number does not show).
func parseTree(data []byte, fn func(e Entry, zeroPadded bool) error) error {
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		if sp <= 0 {
			return errBadTree
		}
		var mode uint32
		for _, c := range data[:sp] {
			if c < '0' || c > '7' {
				return errBadTree
			}
			mode = mode<<3 | uint32(c-'0')
			if mode > 0o7777777 {
				return errBadTree
			}
		}
		rest := data[sp+1:]
		nul := bytes.IndexByte(rest, 0)
		if nul < 0 || len(rest) < nul+21 {
			return errBadTree
		}
		var e Entry
		e.Mode = mode
		e.Name = rest[:nul]
		copy(e.ID[:], rest[nul+1:nul+21])
		if fn != nil {
			if err := fn(e, data[0] == '0'); err != nil {
				return err
			}
		}
		data = rest[nul+21:]
	}
	return nil
}

type treeError struct{}

func (treeError) Error() string { return "cannot be parsed as a tree" }

var errBadTree = treeError{}

// CheckTree checks a tree as fsck_tree does and calls fn (when not nil) for each
// entry of a tree that passes.
func CheckTree(id string, data []byte, fn func(Entry)) error {
	var (
		nullSha1, fullPath, emptyName, hasDot, hasDotdot, hasDotgit bool
		zeroPad, badModes, dups, unsorted, gitmodulesLink           bool
		prev                                                        Entry
		havePrev                                                    bool
		candidates                                                  [][]byte
	)
	err := parseTree(data, func(e Entry, zeroPadded bool) error {
		name := e.Name
		zeroPad = zeroPad || zeroPadded
		nullSha1 = nullSha1 || e.ID == [20]byte{}
		fullPath = fullPath || bytes.IndexByte(name, '/') >= 0
		emptyName = emptyName || len(name) == 0
		hasDot = hasDot || string(name) == "."
		hasDotdot = hasDotdot || string(name) == ".."
		hasDotgit = hasDotgit || IsHFSDotGit(name) || IsNTFSDotGit(name)
		// A backslash separates path components on Windows.
		for i := bytes.IndexByte(name, '\\'); i >= 0; {
			name = name[i+1:]
			hasDotgit = hasDotgit || IsNTFSDotGit(name)
			i = bytes.IndexByte(name, '\\')
		}
		if e.Mode == 0o120000 && (IsHFSDotGitmodules(e.Name) || IsNTFSDotGitmodules(e.Name)) {
			gitmodulesLink = true
		}
		switch e.Mode {
		case 0o100644, 0o100755, 0o120000, 0o40000, 0o160000:
		default:
			badModes = true
		}
		if havePrev {
			switch verifyOrdered(prev.Mode, prev.Name, e.Mode, e.Name, &candidates) {
			case treeUnordered:
				unsorted = true
			case treeHasDups:
				dups = true
			}
		}
		prev, havePrev = e, true
		return nil
	})
	if err != nil {
		return fail(id, "badTree", "cannot be parsed as a tree")
	}
	// The order of git's fsck_tree reports; the first one refuses.
	switch {
	case nullSha1:
		return fail(id, "nullSha1", "contains entries pointing to null sha1")
	case fullPath:
		return fail(id, "fullPathname", "contains full pathnames")
	case emptyName:
		return fail(id, "emptyName", "contains empty pathname")
	case hasDot:
		return fail(id, "hasDot", "contains '.'")
	case hasDotdot:
		return fail(id, "hasDotdot", "contains '..'")
	case hasDotgit:
		return fail(id, "hasDotgit", "contains '.git'")
	case zeroPad:
		return fail(id, "zeroPaddedFilemode", "contains zero-padded file modes")
	case badModes:
		return fail(id, "badFilemode", "contains bad file modes")
	case dups:
		return fail(id, "duplicateEntries", "contains duplicate file entries")
	case unsorted:
		return fail(id, "treeNotSorted", "not properly sorted")
	case gitmodulesLink:
		return fail(id, "gitmodulesSymlink", ".gitmodules is a symbolic link")
	}
	if fn != nil {
		// Parsed again rather than kept: a tree of thousands of entries would
		// otherwise cost a slice of them, per tree.
		_ = ParseTree(data, func(e Entry) error { fn(e); return nil })
	}
	return nil
}

const (
	treeOrdered = iota
	treeUnordered
	treeHasDups
)

func isLessThanSlash(c byte) bool { return c > 0 && c < '/' }

// verifyOrdered is fsck.c's verify_ordered: names compare bytewise with a tree's
// name taken as followed by '/', so a blob "a" and a tree "a" are the same name
// (duplicates), and "a" (tree) sorts after "a.b". candidates holds the blob names
// that a later tree of the same name could duplicate without being next to them
// ("foo", "foo.bar", "foo/").
func verifyOrdered(mode1 uint32, name1 []byte, mode2 uint32, name2 []byte, candidates *[][]byte) int {
	n := min(len(name1), len(name2))
	if cmp := bytes.Compare(name1[:n], name2[:n]); cmp < 0 {
		return treeOrdered
	} else if cmp > 0 {
		return treeUnordered
	}
	var c1, c2 byte
	if n < len(name1) {
		c1 = name1[n]
	}
	if n < len(name2) {
		c2 = name2[n]
	}
	if c1 == 0 && c2 == 0 {
		return treeHasDups
	}
	if c1 == 0 && mode1 == 0o40000 {
		c1 = '/'
	}
	if c2 == 0 && mode2 == 0o40000 {
		c2 = '/'
	}
	if c1 == 0 && isLessThanSlash(c2) {
		*candidates = append(*candidates, name1)
	} else if c2 == '/' && isLessThanSlash(c1) {
		for len(*candidates) > 0 {
			top := (*candidates)[len(*candidates)-1]
			if !bytes.HasPrefix(name2, top) {
				break
			}
			p := name2[len(top):]
			if len(p) == 0 {
				return treeHasDups
			}
			if isLessThanSlash(p[0]) {
				*candidates = (*candidates)[:len(*candidates)-1]
				continue
			}
			break
		}
	}
	if c1 < c2 {
		return treeOrdered
	}
	return treeUnordered
}

// hfsIgnored are the code points HFS+ drops from names (git's next_hfs_char).
func hfsIgnored(r rune) bool {
	switch r {
	case 0x200c, 0x200d, 0x200e, 0x200f, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e,
		0x206a, 0x206b, 0x206c, 0x206d, 0x206e, 0x206f, 0xfeff:
		return true
	}
	return false
}

// nextHFS returns the next code point that HFS+ keeps, and the rest; ok is false
// on invalid UTF-8 (which then cannot be ".git").
func nextHFS(s []byte) (r rune, rest []byte, ok bool) {
	for {
		if len(s) == 0 {
			return 0, s, true
		}
		r, n := utf8.DecodeRune(s)
		if r == utf8.RuneError && n <= 1 {
			return 0, nil, false
		}
		s = s[n:]
		if !hfsIgnored(r) {
			return r, s, true
		}
	}
}

func isHFSDot(name []byte, needle string) bool {
	r, name, ok := nextHFS(name)
	if !ok || r != '.' {
		return false
	}
	for i := 0; i < len(needle); i++ {
		r, name, ok = nextHFS(name)
		if !ok || r > 127 || lower(byte(r)) != needle[i] {
			return false
		}
	}
	r, _, ok = nextHFS(name)
	return ok && (r == 0 || r == '/')
}

// IsHFSDotGit reports whether HFS+ would take name for ".git": case folded, with
// the code points it ignores removed (git's is_hfs_dotgit).
func IsHFSDotGit(name []byte) bool { return isHFSDot(name, "git") }

// IsHFSDotGitmodules is IsHFSDotGit for ".gitmodules".
func IsHFSDotGitmodules(name []byte) bool { return isHFSDot(name, "gitmodules") }

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// onlySpacesAndPeriods reports whether s up to its end or a separator holds only
// what NTFS strips from the end of a name (spaces and periods); an alternate data
// stream (':') also ends it.
func onlySpacesAndPeriods(s []byte) bool {
	for _, c := range s {
		switch c {
		case '/', '\\', ':':
			return true
		case ' ', '.':
		default:
			return false
		}
	}
	return true
}

// IsNTFSDotGit reports whether NTFS would take name for ".git": case folded,
// trailing spaces and periods dropped, or the 8.3 short name "git~1" (git's
// is_ntfs_dotgit).
func IsNTFSDotGit(name []byte) bool {
	switch {
	case len(name) >= 4 && name[0] == '.' && lower(name[1]) == 'g' && lower(name[2]) == 'i' && lower(name[3]) == 't':
		return onlySpacesAndPeriods(name[4:])
	case len(name) >= 5 && lower(name[0]) == 'g' && lower(name[1]) == 'i' && lower(name[2]) == 't' && name[3] == '~' && name[4] == '1':
		return onlySpacesAndPeriods(name[5:])
	}
	return false
}

// IsNTFSDotGitmodules is IsNTFSDotGit for ".gitmodules", whose short names are
// "gitmod~N" and "gi7eba~N" (git's is_ntfs_dotgitmodules).
func IsNTFSDotGitmodules(name []byte) bool {
	if len(name) >= 11 && name[0] == '.' && bytes.EqualFold(name[1:11], []byte("gitmodules")) {
		return onlySpacesAndPeriods(name[11:])
	}
	for _, prefix := range []string{"gitmod~", "gi7eba~"} {
		if len(name) > len(prefix) && bytes.EqualFold(name[:len(prefix)], []byte(prefix)) {
			rest := name[len(prefix):]
			i := 0
			for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
				i++
			}
			if i > 0 && rest[0] != '0' && onlySpacesAndPeriods(rest[i:]) {
				return true
			}
		}
	}
	return false
}

// at returns b[i], or 0 past the end: git's parsers read NUL-terminated buffers.
func at(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}

// verifyHeaders is fsck.c's verify_headers: no NUL before the blank line that ends
// the headers, and the last header line ends with a newline.
func verifyHeaders(id string, data []byte) error {
	for i, c := range data {
		switch c {
		case 0:
			return fail(id, "nulInHeader", fmt.Sprintf("unterminated header: NUL at offset %d", i))
		case '\n':
			if i+1 < len(data) && data[i+1] == '\n' {
				return nil
			}
		}
	}
	if len(data) > 0 && data[len(data)-1] == '\n' {
		return nil
	}
	return fail(id, "unterminatedHeader", "unterminated header")
}

// hashLine parses "<40 hex>\n" at the start of b and returns the id and the rest.
func hashLine(b []byte) (id [20]byte, rest []byte, ok bool) {
	if len(b) < 41 || b[40] != '\n' {
		return id, b, false
	}
	if _, err := hex.Decode(id[:], b[:40]); err != nil {
		return id, b, false
	}
	return id, b[41:], true
}

// CommitRefs are the objects a commit refers to.
type CommitRefs struct {
	Tree    [20]byte
	Parents [][20]byte
}

// CheckCommit checks a commit as fsck_commit does and returns its tree and parents.
func CheckCommit(id string, data []byte) (*CommitRefs, error) {
	if err := verifyHeaders(id, data); err != nil {
		return nil, err
	}
	refs := &CommitRefs{}
	b, ok := bytes.CutPrefix(data, []byte("tree "))
	if !ok {
		return nil, fail(id, "missingTree", "invalid format - expected 'tree' line")
	}
	if refs.Tree, b, ok = hashLine(b); !ok {
		return nil, fail(id, "badTreeSha1", "invalid 'tree' line format - bad sha1")
	}
	for {
		rest, ok := bytes.CutPrefix(b, []byte("parent "))
		if !ok {
			break
		}
		p, rest, ok := hashLine(rest)
		if !ok {
			return nil, fail(id, "badParentSha1", "invalid 'parent' line format - bad sha1")
		}
		refs.Parents = append(refs.Parents, p)
		b = rest
	}
	authors := 0
	for {
		rest, ok := bytes.CutPrefix(b, []byte("author "))
		if !ok {
			break
		}
		authors++
		var err error
		if b, err = checkIdent(id, rest); err != nil {
			return nil, err
		}
	}
	switch {
	case authors < 1:
		return nil, fail(id, "missingAuthor", "invalid format - expected 'author' line")
	case authors > 1:
		return nil, fail(id, "multipleAuthors", "invalid format - multiple 'author' lines")
	}
	b, ok = bytes.CutPrefix(b, []byte("committer "))
	if !ok {
		return nil, fail(id, "missingCommitter", "invalid format - expected 'committer' line")
	}
	if _, err := checkIdent(id, b); err != nil {
		return nil, err
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, fail(id, "nulInCommit", "NUL byte in the commit object body")
	}
	return refs, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// checkIdent is fsck.c's fsck_ident on "Name <email> 1700000000 +0000\n"; it
// returns what follows the line.
func checkIdent(id string, b []byte) ([]byte, error) {
	next := b[len(b):]
	if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
		next = b[nl+1:]
	}
	p := 0
	if at(b, 0) == '<' {
		return nil, fail(id, "missingNameBeforeEmail", "invalid author/committer line - missing space before email")
	}
	for c := at(b, p); c != 0 && c != '<' && c != '>' && c != '\n'; c = at(b, p) {
		p++
	}
	switch {
	case at(b, p) == '>':
		return nil, fail(id, "badName", "invalid author/committer line - bad name")
	case at(b, p) != '<':
		return nil, fail(id, "missingEmail", "invalid author/committer line - missing email")
	case p == 0 || b[p-1] != ' ':
		return nil, fail(id, "missingSpaceBeforeEmail", "invalid author/committer line - missing space before email")
	}
	p++
	for c := at(b, p); c != 0 && c != '<' && c != '>' && c != '\n'; c = at(b, p) {
		p++
	}
	if at(b, p) != '>' {
		return nil, fail(id, "badEmail", "invalid author/committer line - bad email")
	}
	p++
	if at(b, p) != ' ' {
		return nil, fail(id, "missingSpaceBeforeDate", "invalid author/committer line - missing space before date")
	}
	p++
	if at(b, p) == '0' && at(b, p+1) != ' ' {
		return nil, fail(id, "zeroPaddedDate", "invalid author/committer line - zero-padded date")
	}
	if !isDigit(at(b, p)) {
		return nil, fail(id, "badDate", "invalid author/committer line - bad date")
	}
	end := p
	for isDigit(at(b, end)) {
		end++
	}
	// git's timestamps are unsigned 64-bit; a date must also fit a signed time_t.
	if _, err := strconv.ParseInt(string(b[p:end]), 10, 64); err != nil {
		return nil, fail(id, "badDateOverflow", "invalid author/committer line - date causes integer overflow")
	}
	if at(b, end) != ' ' {
		return nil, fail(id, "badDate", "invalid author/committer line - bad date")
	}
	p = end + 1
	if c := at(b, p); (c != '+' && c != '-') || !isDigit(at(b, p+1)) || !isDigit(at(b, p+2)) ||
		!isDigit(at(b, p+3)) || !isDigit(at(b, p+4)) || at(b, p+5) != '\n' {
		return nil, fail(id, "badTimezone", "invalid author/committer line - bad time zone")
	}
	return next, nil
}

// TagRefs is what a tag refers to.
type TagRefs struct {
	Object [20]byte
	Type   string
}

// CheckTag checks a tag as fsck_tag_standalone does and returns its target.
func CheckTag(id string, data []byte) (*TagRefs, error) {
	if err := verifyHeaders(id, data); err != nil {
		return nil, err
	}
	refs := &TagRefs{}
	b, ok := bytes.CutPrefix(data, []byte("object "))
	if !ok {
		return nil, fail(id, "missingObject", "invalid format - expected 'object' line")
	}
	if refs.Object, b, ok = hashLine(b); !ok {
		return nil, fail(id, "badObjectSha1", "invalid 'object' line format - bad sha1")
	}
	if b, ok = bytes.CutPrefix(b, []byte("type ")); !ok {
		return nil, fail(id, "missingTypeEntry", "invalid format - expected 'type' line")
	}
	eol := bytes.IndexByte(b, '\n')
	if eol < 0 {
		return nil, fail(id, "missingType", "invalid format - unexpected end after 'type' line")
	}
	refs.Type = string(b[:eol])
	switch refs.Type {
	case "commit", "tree", "blob", "tag":
	default:
		return nil, fail(id, "badType", "invalid 'type' value")
	}
	b = b[eol+1:]
	if b, ok = bytes.CutPrefix(b, []byte("tag ")); !ok {
		return nil, fail(id, "missingTagEntry", "invalid format - expected 'tag' line")
	}
	eol = bytes.IndexByte(b, '\n')
	if eol < 0 {
		return nil, fail(id, "missingTag", "invalid format - unexpected end after 'type' line")
	}
	b = b[eol+1:]
	// Early tags have no tagger (info-level in git: accepted).
	if rest, ok := bytes.CutPrefix(b, []byte("tagger ")); ok {
		if _, err := checkIdent(id, rest); err != nil {
			return nil, err
		}
	}
	return refs, nil
}
