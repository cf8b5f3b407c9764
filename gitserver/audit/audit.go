package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Entry is one change.
type Entry struct {
	Seq           uint64            `json:"seq"`  // set by Append: increasing across restarts; the cursor
	Time          time.Time         `json:"time"` // set by Append when zero (UTC)
	User          string            `json:"user"`
	Via           string            `json:"via"`              // ssh, git, webhook, mcp, or bex (the platform's own schedules)
	Token         string            `json:"token,omitempty"`  // the API token's name, for mcp
	Client        string            `json:"client,omitempty"` // the MCP client's name and version
	Command       string            `json:"command"`          // the operation, by its ssh command's name ("config:set", "git push", "deploy", ...)
	App           string            `json:"app,omitempty"`
	Database      string            `json:"database,omitempty"`
	ReleaseBefore int64             `json:"release_before,omitempty"`
	ReleaseAfter  int64             `json:"release_after,omitempty"`
	Reason        string            `json:"reason,omitempty"`
	Outcome       string            `json:"outcome"`           // "ok" or "failed" (set "ok" when empty)
	Error         string            `json:"error,omitempty"`   // a failure's message
	Details       map[string]string `json:"details,omitempty"` // the operation's own facts ("keys": "A,B", "to": "3", ...)
}

// Options bound the store.
type Options struct {
	Dir        string           // created 0700 when missing
	MaxAge     time.Duration    // entries older are dropped (default 90 days)
	MaxEntries int              // at most about this many are kept (default 100000)
	Now        func() time.Time // for tests; default time.Now
}

// Defaults of Options and Query.
const (
	DefaultMaxAge     = 90 * 24 * time.Hour
	DefaultMaxEntries = 100000
	DefaultLimit      = 50
	MaxLimit          = 500
	DefaultMaxScan    = 5000
)

// syncInterval is how often a written segment is fsynced: what a crash of the
// machine may lose (see Store).
const syncInterval = time.Second

// ErrClosed is returned by Append and List after Close.
var ErrClosed = errors.New("audit: store closed")

// DefaultOptions are the Options of a store in dir with the default bounds.
func DefaultOptions(dir string) Options {
	return Options{Dir: dir, MaxAge: DefaultMaxAge, MaxEntries: DefaultMaxEntries, Now: time.Now}
}

// Query selects entries, newest first.
type Query struct {
	Before uint64           // only entries with Seq < Before; 0: from the newest (this is the cursor: pass the previous call's next)
	Limit  int              // at most this many (default 50, at most 500)
	Match  func(Entry) bool // nil: all; entries it refuses are skipped and do not count toward Limit
	// MaxScan bounds the entries one call reads (default DefaultMaxScan): a
	// caller whose Match accepts few of them (a member of one quiet app on a
	// busy server) gets a short page and the cursor to go on from, rather than
	// each call reading the whole trail.
	MaxScan int
}

// segment is one file of the trail. Its entries' Seqs run from first up to the
// next segment's first (or the store's nextSeq for the newest one).
type segment struct {
	first  uint64
	path   string
	newest time.Time // the newest entry's Time; zero while empty
}

// Store is the audit trail in one directory. It is safe for concurrent use:
// appends serialize on a mutex; List holds it only to take a snapshot of the
// segments and reads the files without it.
//
// fsync: Append does not fsync. A crash of the process cannot lose a line
// whose write returned (it is in the page cache), and an fsync per append
// would cost milliseconds per change on most disks, under the mutex, for every
// push and command. Instead a goroutine fsyncs the newest segment once a
// second when it was written, so a crash of the machine loses at most about the
// last second; a closing segment is fsynced before the next one is made, and
// Close fsyncs.
type Store struct {
	opts    Options
	segSize uint64   // entries per segment
	lock    *os.File // Dir/lock, flocked while open

	mu       sync.Mutex
	segs     []segment // oldest first; the last is the one appended to
	f        *os.File  // the last segment, O_APPEND
	size     int64     // bytes of whole lines in f: what List reads of it
	nextSeq  uint64
	torn     bool // a failed write may have left part of a line after size
	unsynced bool // written since the last fsync
	closed   bool

	// readSegment reads a segment's first limit bytes (all when limit < 0);
	// tests count its calls.
	readSegment func(path string, limit int64) ([]byte, error)

	stop chan struct{}
	done chan struct{}
}

// Open opens the trail in opts.Dir, making the directory when missing. The
// newest segment's torn or bad last lines are cut off, and what the bounds no
// longer allow is dropped.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("audit: no directory")
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		opts: opts,
		// Segments of a tenth of MaxEntries: dropping the oldest keeps between
		// 90% and 100% of MaxEntries, with about eleven files to stat and a
		// tenth of the trail at most to read for a page. By count rather than
		// only by day, so that a burst (a looping agent) cannot make one file of
		// the whole trail; by day as well (Append), so that on a quiet server
		// an entry outlives MaxAge by a day at most, not by a segment's months.
		segSize:     uint64(max(opts.MaxEntries/10, 1)),
		lock:        lock,
		readSegment: readSegment,
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	if err := s.load(); err != nil {
		unlockDir(lock)
		return nil, err
	}
	s.prune(opts.Now())
	go s.syncLoop()
	return s, nil
}

// load finds the segments, the newest entry of each, and the next Seq, and
// opens the newest segment for appending (making the first when there is none).
func (s *Store) load() error {
	segs, err := listSegments(s.opts.Dir)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		f, err := createSegment(s.opts.Dir, 1)
		if err != nil {
			return err
		}
		s.segs = []segment{{first: 1, path: segmentPath(s.opts.Dir, 1)}}
		s.f, s.nextSeq = f, 1
		return nil
	}
	for i := range segs[:len(segs)-1] {
		e, _, ok, err := readLast(segs[i].path)
		if err != nil {
			return err
		}
		if ok {
			segs[i].newest = e.Time
		}
	}
	last := &segs[len(segs)-1]
	f, err := os.OpenFile(last.path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	e, end, ok, err := lastEntry(f, fi.Size())
	if err != nil {
		f.Close()
		return err
	}
	if end < fi.Size() {
		// A line torn by a crash, or lines that are not entries: cut them, so
		// that the next line is not glued to a half one.
		if err := f.Truncate(end); err != nil {
			f.Close()
			return fmt.Errorf("audit: cutting the torn end of %s: %w", last.path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("audit: %w", err)
		}
	}
	s.nextSeq = last.first
	if ok {
		last.newest = e.Time
		s.nextSeq = max(s.nextSeq, e.Seq+1)
	}
	s.segs, s.f, s.size = segs, f, end
	return nil
}

// Append stores e and returns it as stored: its Seq set, its Time set when
// zero (both UTC), Outcome "ok" when empty, and its strings cleaned (see the
// package comment). It returns once the line is written, not synced.
func (s *Store) Append(e Entry) (Entry, error) {
	e = clean(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Entry{}, ErrClosed
	}
	now := s.opts.Now()
	if e.Time.IsZero() {
		e.Time = now
	}
	e.Time = e.Time.UTC()
	if s.torn {
		if err := s.f.Truncate(s.size); err != nil {
			return Entry{}, fmt.Errorf("audit: cutting a torn line: %w", err)
		}
		s.torn = false
	}
	if n := s.segs[len(s.segs)-1].newest; !n.IsZero() && !sameDay(n, now) {
		if err := s.rollover(); err != nil {
			return Entry{}, err
		}
	}
	e.Seq = s.nextSeq
	line, err := encode(e)
	if err != nil {
		return Entry{}, err
	}
	// One write on an O_APPEND file: the line lands whole at the end, or (a
	// full disk) partly, which is cut now or before the next append.
	if _, err := s.f.Write(line); err != nil {
		s.torn = true
		if s.f.Truncate(s.size) == nil {
			s.torn = false
		}
		return Entry{}, fmt.Errorf("audit: %w", err)
	}
	s.size += int64(len(line))
	s.nextSeq++
	s.unsynced = true
	last := &s.segs[len(s.segs)-1]
	if e.Time.After(last.newest) {
		last.newest = e.Time
	}
	if s.nextSeq-last.first >= s.segSize {
		// The entry is stored: a failure to start the next segment is not
		// its failure, and the next append tries again.
		_ = s.rollover()
	}
	s.prune(now)
	return e, nil
}

// rollover closes the newest segment and starts the next, named by nextSeq.
// The caller holds mu.
func (s *Store) rollover() error {
	if s.torn && s.f.Truncate(s.size) == nil {
		s.torn = false
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	f, err := createSegment(s.opts.Dir, s.nextSeq)
	if err != nil {
		return err
	}
	s.f.Close()
	s.segs = append(s.segs, segment{first: s.nextSeq, path: segmentPath(s.opts.Dir, s.nextSeq)})
	s.f, s.size, s.torn, s.unsynced = f, 0, false, false
	return nil
}

// prune drops the oldest segments while their newest entry is older than
// MaxAge or the trail holds more than MaxEntries. A newest segment whose
// entries have all aged out is closed first (a new empty one named by the next
// Seq takes its place), so a quiet store forgets too. Failures are left for the
// next call. The caller holds mu.
func (s *Store) prune(now time.Time) {
	cutoff := now.Add(-s.opts.MaxAge)
	if n := s.segs[len(s.segs)-1].newest; !n.IsZero() && n.Before(cutoff) {
		if s.rollover() != nil {
			return
		}
	}
	for len(s.segs) > 1 {
		old := s.segs[0]
		if !old.newest.Before(cutoff) && s.nextSeq-old.first <= uint64(s.opts.MaxEntries) {
			return
		}
		if err := os.Remove(old.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return
		}
		s.segs = s.segs[1:]
	}
}

// List returns the entries q selects, newest first, and the cursor of the next
// page: the Seq to pass as q.Before, 0 when no older entry remains (it may be
// non-zero with none left that q.Match accepts; that page is then empty). It
// reads segments newest first and stops at q.Limit, so a page costs a segment
// or so, not the trail. Match is called without the store's lock held.
func (s *Store) List(q Query) (entries []Entry, next uint64, err error) {
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	maxScan := q.MaxScan
	if maxScan <= 0 {
		maxScan = DefaultMaxScan
	}
	scanned := 0

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, 0, ErrClosed
	}
	s.prune(s.opts.Now())
	segs := slices.Clone(s.segs)
	size := s.size
	s.mu.Unlock()

	for i := len(segs) - 1; i >= 0; i-- {
		seg := segs[i]
		if q.Before != 0 && seg.first >= q.Before {
			continue
		}
		// Of the newest segment, only the lines written when the snapshot was
		// taken: an append running now may have written part of its line.
		lim := int64(-1)
		if i == len(segs)-1 {
			lim = size
		}
		data, err := s.readSegment(seg.path, lim)
		if errors.Is(err, fs.ErrNotExist) {
			continue // dropped by the bounds since the snapshot
		}
		if err != nil {
			return nil, 0, fmt.Errorf("audit: %w", err)
		}
		// Lines from the last, leaving out any part line after the last newline.
		end := bytes.LastIndexByte(data, '\n')
		for end >= 0 {
			start := bytes.LastIndexByte(data[:end], '\n') + 1
			line := data[start:end]
			end = start - 1
			if seq, ok := peekSeq(line); ok && q.Before != 0 && seq >= q.Before {
				continue
			}
			e, ok := decode(line)
			if !ok || (q.Before != 0 && e.Seq >= q.Before) {
				continue
			}
			if scanned++; scanned > maxScan {
				// Cut: the next call goes on from the entry not read.
				return entries, e.Seq + 1, nil
			}
			if q.Match != nil && !q.Match(e) {
				continue
			}
			entries = append(entries, e)
			if len(entries) == limit {
				if end >= 0 || i > 0 {
					return entries, e.Seq, nil
				}
				return entries, 0, nil
			}
		}
	}
	return entries, 0, nil
}

// Close syncs and closes the store; later calls to Append and List return
// ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done

	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.f.Sync()
	err = errors.Join(err, s.f.Close())
	unlockDir(s.lock)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// syncLoop fsyncs the newest segment every syncInterval when it was written.
// The fsync runs without mu, so appends do not wait for the disk; a rollover
// closing the file meanwhile has synced it itself (Sync then fails, harmlessly).
func (s *Store) syncLoop() {
	defer close(s.done)
	t := time.NewTicker(syncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		f, dirty := s.f, s.unsynced
		s.unsynced = false
		s.mu.Unlock()
		if dirty {
			// An error here has no caller to go to; on Linux it is not
			// reported twice either, so retrying would say nothing.
			_ = f.Sync()
		}
	}
}

// ErrInUse is Open's error when another store has the directory open: a
// gitserver that has not stopped yet (a rolling update's old pod).
var ErrInUse = errors.New("in use by another store")

// lockDir takes Dir/lock's flock: two stores appending to one directory would
// hand out the same Seqs.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir+"/lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("audit: %s is %w", dir, ErrInUse)
		}
		return nil, fmt.Errorf("audit: locking %s: %w", dir, err)
	}
	return f, nil
}

func unlockDir(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}

// sameDay says whether a and b fall on the same UTC day.
func sameDay(a, b time.Time) bool {
	ay, am, ad := a.UTC().Date()
	by, bm, bd := b.UTC().Date()
	return ay == by && am == bm && ad == bd
}

// encode is e's line, newline included. HTML is not escaped: the trail is
// read as JSON, never embedded in a page as it is.
func encode(e Entry) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return b.Bytes(), nil
}

// decode reads one line; a line that is not an entry (torn, or not JSON, or
// without a Seq) is not ok.
func decode(line []byte) (Entry, bool) {
	var e Entry
	if err := json.Unmarshal(line, &e); err != nil || e.Seq == 0 {
		return Entry{}, false
	}
	return e, true
}

// peekSeq reads the Seq at the start of a line as encode writes it, so that
// List skips the entries newer than its cursor without decoding them.
func peekSeq(line []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(`{"seq":`))
	if !ok {
		return 0, false
	}
	var n uint64
	i := 0
	for ; i < len(rest) && i < 19 && rest[i] >= '0' && rest[i] <= '9'; i++ {
		n = n*10 + uint64(rest[i]-'0')
	}
	if i == 0 || i == len(rest) || rest[i] != ',' {
		return 0, false
	}
	return n, true
}
