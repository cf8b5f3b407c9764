package audit

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// clock is a settable Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func open(t testing.TB, opts Options) *Store {
	t.Helper()
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func appendN(t testing.TB, s *Store, n int, mk func(i int) Entry) []Entry {
	t.Helper()
	var out []Entry
	for i := range n {
		e := Entry{User: "alice", Via: "ssh", Command: "config:set", App: "web"}
		if mk != nil {
			e = mk(i)
		}
		got, err := s.Append(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got)
	}
	return out
}

// listAll pages through the trail with q, checking each cursor.
func listAll(t testing.TB, s *Store, q Query) (all []Entry, pages int) {
	t.Helper()
	for {
		es, next, err := s.List(q)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, es...)
		if next == 0 {
			return all, pages
		}
		if len(es) == 0 || next != es[len(es)-1].Seq {
			t.Fatalf("page before %d: next %d, last of %d entries is not it", q.Before, next, len(es))
		}
		if pages > 10000 {
			t.Fatal("paging does not end")
		}
		q.Before = next
	}
}

func seqs(es []Entry) []uint64 {
	var out []uint64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

// desc is n, n-1, ..., from.
func desc(n, from uint64) []uint64 {
	var out []uint64
	for i := n; i >= from && i > 0; i-- {
		out = append(out, i)
	}
	return out
}

func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

func TestAppendListPaging(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	s := open(t, Options{Dir: dir, MaxEntries: 50, Now: c.Now}) // segments of 5
	in := appendN(t, s, 23, func(i int) Entry {
		c.Advance(time.Second)
		return Entry{User: "alice", Via: "ssh", Command: "config:set", App: fmt.Sprintf("app%d", i%3)}
	})
	for i, e := range in {
		if e.Seq != uint64(i+1) {
			t.Fatalf("entry %d: seq %d", i, e.Seq)
		}
	}
	if files := segmentFiles(t, dir); len(files) != 5 || filepath.Base(files[4]) != "audit-00000000000000000021.jsonl" {
		t.Fatalf("segments: %v", files)
	}

	es, next, err := s.List(Query{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqs(es), desc(23, 1)) || next != 0 {
		t.Fatalf("all: %v next %d", seqs(es), next)
	}
	want := slices.Clone(in)
	slices.Reverse(want)
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", es[0], want[0])
	}

	all, pages := listAll(t, s, Query{Limit: 4})
	if !slices.Equal(seqs(all), desc(23, 1)) || pages != 6 {
		t.Fatalf("pages of 4: %d pages, %v", pages, seqs(all))
	}

	// A page ending on the oldest entry says there is no more; one ending
	// just before it gives a cursor.
	if _, next, _ := s.List(Query{Limit: 23}); next != 0 {
		t.Fatalf("limit 23: next %d", next)
	}
	if _, next, _ := s.List(Query{Limit: 22}); next != 2 {
		t.Fatalf("limit 22: next %d", next)
	}
	es, next, _ = s.List(Query{Before: 12, Limit: 3})
	if !slices.Equal(seqs(es), []uint64{11, 10, 9}) || next != 9 {
		t.Fatalf("before 12: %v next %d", seqs(es), next)
	}

	app1 := func(e Entry) bool { return e.App == "app1" }
	all, _ = listAll(t, s, Query{Limit: 3, Match: app1})
	var wantSeqs []uint64
	for _, e := range want {
		if app1(e) {
			wantSeqs = append(wantSeqs, e.Seq)
		}
	}
	if !slices.Equal(seqs(all), wantSeqs) {
		t.Fatalf("matching app1: %v, want %v", seqs(all), wantSeqs)
	}
	// Refused entries do not count: a page holds Limit matching ones.
	es, next, _ = s.List(Query{Limit: 3, Match: app1})
	if !slices.Equal(seqs(es), []uint64{23, 20, 17}) || next != 17 {
		t.Fatalf("matching page: %v next %d", seqs(es), next)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(Entry{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if _, _, err := s.List(Query{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("list after close: %v", err)
	}
}

func TestListLimitCapped(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MaxEntries: 10000})
	appendN(t, s, 600, nil)
	es, next, err := s.List(Query{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != MaxLimit || next != 101 {
		t.Fatalf("limit 1000: %d entries, next %d", len(es), next)
	}
}

// A page reads the segments it needs, newest first, and no more.
func TestListReadsOnlyWhatAPageNeeds(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MaxEntries: 100}) // segments of 10
	appendN(t, s, 95, nil)
	var read []string
	s.readSegment = func(path string, limit int64) ([]byte, error) {
		read = append(read, filepath.Base(path))
		return readSegment(path, limit)
	}
	for _, c := range []struct {
		q     Query
		reads []string
	}{
		{Query{Limit: 5}, []string{"audit-00000000000000000091.jsonl"}},
		{Query{Limit: 8}, []string{"audit-00000000000000000091.jsonl", "audit-00000000000000000081.jsonl"}},
		{Query{Before: 50, Limit: 5}, []string{"audit-00000000000000000041.jsonl"}},
		{Query{Before: 50, Limit: 10}, []string{"audit-00000000000000000041.jsonl", "audit-00000000000000000031.jsonl"}},
	} {
		read = nil
		if _, _, err := s.List(c.q); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(read, c.reads) {
			t.Errorf("before %d limit %d read %v, want %v", c.q.Before, c.q.Limit, read, c.reads)
		}
	}
}

func TestReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	opts := Options{Dir: dir, MaxEntries: 50} // segments of 5
	s := open(t, opts)
	in := appendN(t, s, 7, nil)

	if _, err := Open(opts); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second store on the same dir: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, opts)
	e, err := s.Append(Entry{User: "bob", Via: "git", Command: "git push"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Seq != 8 {
		t.Fatalf("seq after reopen: %d", e.Seq)
	}
	es, _, err := s.List(Query{})
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(in), e)
	slices.Reverse(want)
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("after reopen: %v", seqs(es))
	}

	// Closed on a segment's end: the new empty segment's name keeps the Seq.
	appendN(t, s, 2, nil) // 10: segment audit-11 is made, empty
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, opts)
	if e, err := s.Append(Entry{}); err != nil || e.Seq != 11 {
		t.Fatalf("seq after reopen on a boundary: %d, %v", e.Seq, err)
	}

	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v", fi.Mode().Perm())
	}
	for _, f := range segmentFiles(t, dir) {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v", f, fi.Mode().Perm())
		}
	}
}

// appendRaw writes to a segment as a crash would have left it.
func appendRaw(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkLines checks every line of the segment at path is an entry and the
// file ends with a newline.
func checkLines(t *testing.T, path string, n int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(data, []byte("\n")) {
		t.Fatalf("%s does not end with a newline: %q", path, data)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("%s: %d lines, want %d", path, len(lines), n)
	}
	for _, l := range lines {
		if _, ok := decode([]byte(l)); !ok {
			t.Fatalf("%s: bad line %q", path, l)
		}
	}
}

func TestTornLastLine(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxEntries: 100} // segments of 10
	s := open(t, opts)
	appendN(t, s, 3, nil)
	s.Close()
	seg := segmentPath(dir, 1)

	for i, torn := range []string{
		`{"seq":4,"time":"2026-03-01T1`, // no newline
		"not json\n",                    // a whole line that is not an entry
		"{}\n{\"seq\":4,",               // one without a Seq, and a torn one
	} {
		appendRaw(t, seg, torn)
		s = open(t, opts)
		es, next, err := s.List(Query{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(seqs(es), desc(uint64(3+i), 1)) || next != 0 {
			t.Fatalf("%q: listed %v", torn, seqs(es))
		}
		e, err := s.Append(Entry{User: "carol", Via: "mcp", Command: "deploy"})
		if err != nil || e.Seq != uint64(4+i) {
			t.Fatalf("%q: append after it: seq %d, %v", torn, e.Seq, err)
		}
		es, _, _ = s.List(Query{Limit: 1})
		if len(es) != 1 || !reflect.DeepEqual(es[0], e) {
			t.Fatalf("%q: read back %+v, want %+v", torn, es, e)
		}
		s.Close()
		checkLines(t, seg, 4+i)
	}

	// A newest segment holding only a torn line: its name still gives the Seq.
	s = open(t, opts)
	appendN(t, s, 4, nil) // 10: audit-11 is made, empty
	s.Close()
	appendRaw(t, segmentPath(dir, 11), `{"seq":11,"ti`)
	s = open(t, opts)
	if e, err := s.Append(Entry{}); err != nil || e.Seq != 11 {
		t.Fatalf("after a torn first line: seq %d, %v", e.Seq, err)
	}
	checkLines(t, segmentPath(dir, 11), 1)
}

func TestBadLineInTheMiddleIsSkipped(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxEntries: 50}
	s := open(t, opts)
	appendN(t, s, 12, nil)
	s.Close()

	seg := segmentPath(dir, 1)
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	lines[2] = `{"seq":3,"time":` + "\n"
	if err := os.WriteFile(seg, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}

	s = open(t, opts)
	all, _ := listAll(t, s, Query{Limit: 4})
	want := slices.DeleteFunc(desc(12, 1), func(n uint64) bool { return n == 3 })
	if !slices.Equal(seqs(all), want) {
		t.Fatalf("listed %v, want %v", seqs(all), want)
	}
	if e, err := s.Append(Entry{}); err != nil || e.Seq != 13 {
		t.Fatalf("append: %d, %v", e.Seq, err)
	}
}

func TestBoundByEntries(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxEntries: 20} // segments of 2
	s := open(t, opts)
	appendN(t, s, 100, nil)
	check := func(newest uint64) {
		t.Helper()
		es, _, err := s.List(Query{Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(es); n < 18 || n > 20 || !slices.Equal(seqs(es), desc(newest, newest-uint64(n)+1)) {
			t.Fatalf("kept %v", seqs(es))
		}
		if files := segmentFiles(t, dir); len(files) > 11 {
			t.Fatalf("%d segments: %v", len(files), files)
		}
	}
	check(100)
	s.Close()
	s = open(t, opts)
	appendN(t, s, 1, nil)
	check(101)
}

func TestBoundByAge(t *testing.T) {
	dir := t.TempDir()
	c := newClock()
	opts := Options{Dir: dir, MaxAge: 72 * time.Hour, MaxEntries: 1000, Now: c.Now}
	s := open(t, opts)
	start := c.Now()
	for day := range 6 {
		c.Set(start.Add(time.Duration(day) * 24 * time.Hour))
		for range 3 {
			if _, err := s.Append(Entry{Details: map[string]string{"day": fmt.Sprint(day)}}); err != nil {
				t.Fatal(err)
			}
			c.Advance(time.Minute)
		}
	}
	if _, err := s.Append(Entry{Details: map[string]string{"day": "5"}}); err != nil {
		t.Fatal(err)
	}
	// One segment a day; the cut-off is day 2 at 12:03, so day 2's segment
	// (newest entry 12:02) goes, days 3 to 5 stay.
	es, _, err := s.List(Query{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	days := map[string]int{}
	for _, e := range es {
		days[e.Details["day"]]++
		if e.Time.Before(start.Add(3 * 24 * time.Hour)) {
			t.Errorf("entry %d of %v kept", e.Seq, e.Time)
		}
	}
	if !reflect.DeepEqual(days, map[string]int{"3": 3, "4": 3, "5": 4}) {
		t.Fatalf("kept per day: %v", days)
	}
	if files := segmentFiles(t, dir); len(files) != 3 {
		t.Fatalf("segments: %v", files)
	}

	// A quiet store forgets too, and keeps counting across a restart.
	c.Advance(10 * 24 * time.Hour)
	s.Close()
	s = open(t, opts)
	if es, next, err := s.List(Query{}); err != nil || len(es) != 0 || next != 0 {
		t.Fatalf("after 10 quiet days: %v next %d, %v", seqs(es), next, err)
	}
	if files := segmentFiles(t, dir); len(files) != 1 || filepath.Base(files[0]) != "audit-00000000000000000020.jsonl" {
		t.Fatalf("segments after 10 quiet days: %v", files)
	}
	if e, err := s.Append(Entry{}); err != nil || e.Seq != 20 {
		t.Fatalf("append: seq %d, %v", e.Seq, err)
	}
}

func TestClean(t *testing.T) {
	c := newClock()
	s := open(t, Options{Dir: t.TempDir(), Now: c.Now})
	details := map[string]string{"a msg\n": "fix\ttabs\r\n\u202eevil"}
	for i := range 24 {
		details[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 300)
	}
	in := Entry{
		User:     "al\x1b[31mice",
		Via:      "mcp",
		Client:   "claude\u0085 1.0\u009b",
		Command:  "config:set",
		App:      "a\xffb",
		Reason:   "why\u2066not\u2069\u202aok\u202c\x7f" + strings.Repeat("é", 300),
		Error:    strings.Repeat("x", 2000),
		Database: strings.Repeat("d", 300),
		Details:  details,
	}
	got, err := s.Append(in)
	if err != nil {
		t.Fatal(err)
	}
	if got.User != "al [31mice" || got.Client != "claude  1.0 " || got.App != "a\uFFFDb" {
		t.Errorf("cleaned: user %q client %q app %q", got.User, got.Client, got.App)
	}
	if !strings.HasPrefix(got.Reason, "why not  ok  é") {
		t.Errorf("reason %q", got.Reason)
	}
	for name, c := range map[string]struct {
		s   string
		max int
	}{"reason": {got.Reason, 500}, "error": {got.Error, 1000}, "database": {got.Database, 200}} {
		if len(c.s) > c.max || len(c.s) < c.max-4 || !strings.HasSuffix(c.s, "…") || !utf8.ValidString(c.s) {
			t.Errorf("%s capped to %d bytes: %q", name, len(c.s), c.s)
		}
	}
	if len(got.Details) != 20 || got.Details["k00"] == "" || got.Details["k18"] == "" {
		t.Errorf("details keys: %d", len(got.Details))
	}
	if _, ok := got.Details["k19"]; ok {
		t.Errorf("details kept k19, past the first 20 keys in order: %v", slices.Sorted(maps.Keys(got.Details)))
	}
	if v := got.Details["a msg "]; v != "fix tabs   evil" {
		t.Errorf("details msg: %q", v)
	}
	for k, v := range got.Details {
		if len(v) > 200 || len(k) > 200 {
			t.Errorf("details %s: %d bytes", k, len(v))
		}
	}
	if len(details) != 25 || details["k00"] != strings.Repeat("v", 300) {
		t.Error("the caller's Details were changed")
	}
	if got.Outcome != "ok" || !got.Time.Equal(c.Now()) || got.Time.Location() != time.UTC {
		t.Errorf("outcome %q time %v", got.Outcome, got.Time)
	}
	es, _, err := s.List(Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || !reflect.DeepEqual(es[0], got) {
		t.Fatalf("read back %+v\nwant %+v", es, got)
	}

	// A time given is kept, in UTC; an outcome given is kept.
	when := time.Date(2026, 2, 1, 9, 0, 0, 0, time.FixedZone("CET", 3600))
	got, err = s.Append(Entry{Time: when, Outcome: "failed", Error: "boom"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(when) || got.Time.Location() != time.UTC || got.Outcome != "failed" {
		t.Errorf("given time and outcome: %v %q", got.Time, got.Outcome)
	}
}

func TestConcurrentAppends(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MaxEntries: 5000}) // segments of 500
	const writers, each = 8, 250
	got := make([][]uint64, writers)
	var wg sync.WaitGroup
	done := make(chan struct{})
	// Readers meanwhile see whole, ordered pages.
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				es, _, err := s.List(Query{Limit: 100})
				if err != nil {
					t.Error(err)
					return
				}
				for i := 1; i < len(es); i++ {
					if es[i].Seq >= es[i-1].Seq {
						t.Errorf("page out of order: %v", seqs(es))
						return
					}
				}
			}
		})
	}
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				e, err := s.Append(Entry{User: fmt.Sprintf("w%d", w), Via: "ssh", Command: "config:set", Details: map[string]string{"i": fmt.Sprint(i)}})
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], e.Seq)
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()

	seen := map[uint64]bool{}
	for w, ss := range got {
		if !slices.IsSorted(ss) {
			t.Errorf("writer %d got seqs out of order", w)
		}
		for _, n := range ss {
			if seen[n] {
				t.Fatalf("seq %d handed out twice", n)
			}
			seen[n] = true
		}
	}
	all, _ := listAll(t, s, Query{Limit: 500})
	if !slices.Equal(seqs(all), desc(writers*each, 1)) {
		t.Fatalf("listed %d entries", len(all))
	}
}

func BenchmarkAppend(b *testing.B) {
	s := open(b, DefaultOptions(b.TempDir()))
	e := Entry{
		User: "alice", Via: "mcp", Token: "ci", Client: "claude-code 1.2.3",
		Command: "config:set", App: "web", ReleaseBefore: 41, ReleaseAfter: 42,
		Reason: "rotate the API key", Details: map[string]string{"keys": "API_KEY,SECRET"},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Append(e); err != nil {
			b.Fatal(err)
		}
	}
}

// Lines longer than Open's read from a segment's end are found whole.
func TestLongLines(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir}
	s := open(t, opts)
	q := func(n int) string { return strings.Repeat(`"`, n) } // escaped: two bytes each
	big := func(i int) Entry {
		d := map[string]string{}
		for k := range 20 {
			d[fmt.Sprintf("%02d%s", k, q(198))] = q(200)
		}
		return Entry{User: fmt.Sprint(i), Reason: q(500), Error: q(1000), Details: d}
	}
	in := appendN(t, s, 3, big)
	s.Close()
	seg := segmentPath(dir, 1)
	if fi, err := os.Stat(seg); err != nil || fi.Size() < 3*tailChunk {
		t.Fatalf("lines are not longer than %d bytes: %v", tailChunk, err)
	}
	appendRaw(t, seg, `{"seq":4,"user":"`+strings.Repeat("x", 2*tailChunk))

	s = open(t, opts)
	e, err := s.Append(big(3))
	if err != nil || e.Seq != 4 {
		t.Fatalf("append: seq %d, %v", e.Seq, err)
	}
	es, _, err := s.List(Query{})
	if err != nil {
		t.Fatal(err)
	}
	want := append(in, e)
	slices.Reverse(want)
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("read back %v", seqs(es))
	}
	checkLines(t, seg, 4)
}

// A caller whose Match accepts few entries reads at most MaxScan of them per
// call and gets the cursor to go on from: pages followed to the end find
// every match, once, and no call reads more than its bound.
func TestListScansABoundedNumberOfEntries(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), MaxEntries: 10000})
	appendN(t, s, 100, nil) // seqs 1..100
	rare := func(e Entry) bool { return e.Seq%30 == 0 }
	var found []uint64
	calls, before := 0, uint64(0)
	for {
		calls++
		read := 0
		es, next, err := s.List(Query{Before: before, Limit: 50, MaxScan: 10, Match: func(e Entry) bool { read++; return rare(e) }})
		if err != nil {
			t.Fatal(err)
		}
		if read > 10 {
			t.Fatalf("call %d read %d entries, more than MaxScan 10", calls, read)
		}
		for _, e := range es {
			found = append(found, e.Seq)
		}
		if next == 0 {
			break
		}
		if before != 0 && next >= before {
			t.Fatalf("the cursor does not move: %d after %d", next, before)
		}
		before = next
	}
	if !slices.Equal(found, []uint64{90, 60, 30}) || calls != 10 {
		t.Fatalf("found %v in %d calls, want [90 60 30] in 10", found, calls)
	}
}
