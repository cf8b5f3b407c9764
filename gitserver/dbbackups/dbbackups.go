package dbbackups

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kind is how a backup came to be.
type Kind string

// The kinds.
const (
	// Captured: postgres:backups:capture (or the MCP tool) asked for it.
	Captured Kind = "captured"
	// Scheduled: the database's backup schedule took it.
	Scheduled Kind = "scheduled"
)

// Backup is one kept dump.
type Backup struct {
	ID      string    `json:"id"`
	Kind    Kind      `json:"kind"`
	Created time.Time `json:"created"`
	Bytes   int64     `json:"bytes"`
}

// ErrNotFound is returned for a backup ID the database does not have.
var ErrNotFound = errors.New("no such backup")

// ErrDiskFull is returned when the dump would leave the file system with less
// than the store's floor; nothing of it is kept.
var ErrDiskFull = errors.New("the server's disk is too full to keep this backup")

// idLayout is the time part of an ID.
const idLayout = "20060102-150405"

var (
	idPattern   = regexp.MustCompile(`^[0-9]{8}-[0-9]{6}(-[0-9]{1,4})?$`)
	namePattern = regexp.MustCompile(`^([0-9]{8}-[0-9]{6}(?:-[0-9]{1,4})?)\.(captured|scheduled)\.dump$`)
	// A Database's UID as the API server makes them; anything else never
	// reaches a path.
	uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// tmpPrefix marks a dump being written; one left by a crash is removed by
// Sweep.
const tmpPrefix = ".tmp-"

// checkEvery is how many bytes are written between two checks of the free
// space (each makes sure of room for that many).
const checkEvery = 4 << 20

// Store is the directory of every database's backups.
type Store struct {
	// Dir holds one directory per database (by UID).
	Dir string
	// MinFreeBytes is the floor of free space a dump must leave on Dir's file
	// system.
	MinFreeBytes uint64
	// Now is the clock; nil: time.Now.
	Now func() time.Time

	// naming makes choosing an ID and linking the dump under it one step:
	// two dumps that end in the same second (a capture and the schedule)
	// never take the same ID.
	naming sync.Mutex
}

// ValidID reports whether id has the form of a backup's ID.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Store) dir(uid string) (string, error) {
	if !uidPattern.MatchString(uid) {
		return "", fmt.Errorf("dbbackups: %q is not a database's UID", uid)
	}
	return filepath.Join(s.Dir, uid), nil
}

// Create keeps what dump writes as a new backup of the database uid. A dump
// that fails, or that would take the disk under the floor, leaves nothing.
func (s *Store) Create(uid string, kind Kind, dump func(io.Writer) error) (Backup, error) {
	if kind != Captured && kind != Scheduled {
		return Backup{}, fmt.Errorf("dbbackups: unknown kind %q", kind)
	}
	dir, err := s.dir(uid)
	if err != nil {
		return Backup{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Backup{}, err
	}
	if err := s.checkFree(dir, 0); err != nil {
		return Backup{}, err
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return Backup{}, err
	}
	tmp := f.Name()
	keep := false
	defer func() {
		if !keep {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	w := &floorWriter{f: f, check: func(n int64) error { return s.checkFree(dir, uint64(n)) }}
	if err := dump(w); err != nil {
		if w.err != nil {
			return Backup{}, w.err
		}
		return Backup{}, err
	}
	if w.err != nil {
		return Backup{}, w.err
	}
	if err := f.Sync(); err != nil {
		return Backup{}, err
	}
	if err := f.Close(); err != nil {
		return Backup{}, err
	}
	s.naming.Lock()
	defer s.naming.Unlock()
	created := s.now().Truncate(time.Second)
	id := created.Format(idLayout)
	for n := 2; ; n++ {
		if !s.exists(dir, id) {
			break
		}
		id = created.Format(idLayout) + "-" + strconv.Itoa(n)
	}
	name := filepath.Join(dir, id+"."+string(kind)+".dump")
	// Link, not rename: it fails rather than replace a backup another
	// process put there.
	if err := os.Link(tmp, name); err != nil {
		return Backup{}, err
	}
	_ = os.Remove(tmp)
	keep = true
	if err := syncDir(dir); err != nil {
		return Backup{}, err
	}
	return Backup{ID: id, Kind: kind, Created: created, Bytes: w.n}, nil
}

func (s *Store) exists(dir, id string) bool {
	for _, k := range []Kind{Captured, Scheduled} {
		if _, err := os.Lstat(filepath.Join(dir, id+"."+string(k)+".dump")); err == nil {
			return true
		}
	}
	return false
}

// checkFree refuses when the file system of dir has less than the floor and
// coming bytes free.
func (s *Store) checkFree(dir string, coming uint64) error {
	if s.MinFreeBytes == 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if free := st.Bavail * uint64(st.Bsize); free < s.MinFreeBytes+coming {
		return ErrDiskFull
	}
	return nil
}

// floorWriter writes to f. Before it writes past what it last made sure of,
// it makes sure the file system has room for the next checkEvery bytes above
// the floor; once it fails, every write fails.
type floorWriter struct {
	f     *os.File
	check func(coming int64) error
	n     int64
	room  int64 // w.n may grow to room without another check
	err   error
}

func (w *floorWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.n+int64(len(p)) > w.room {
		coming := int64(len(p)) + checkEvery
		if err := w.check(coming); err != nil {
			w.err = err
			return 0, err
		}
		w.room = w.n + coming
	}
	n, err := w.f.Write(p)
	w.n += int64(n)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = ErrDiskFull
		}
		w.err = err
	}
	return n, err
}

// List is the database's backups, newest first.
func (s *Store) List(uid string) ([]Backup, error) {
	dir, err := s.dir(uid)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Backup{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []Backup{}
	for _, e := range ents {
		m := namePattern.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		created, err := time.Parse(idLayout, m[1][:len(idLayout)])
		if err != nil {
			continue
		}
		out = append(out, Backup{ID: m[1], Kind: Kind(m[2]), Created: created.UTC(), Bytes: info.Size()})
	}
	slices.SortFunc(out, func(a, b Backup) int { return compareIDs(b.ID, a.ID) })
	return out, nil
}

// compareIDs orders IDs by time, then by their number within a second.
func compareIDs(a, b string) int {
	ta, na := splitID(a)
	tb, nb := splitID(b)
	if c := strings.Compare(ta, tb); c != 0 {
		return c
	}
	return na - nb
}

// splitID is an ID's time and its number within that second (1 for the
// first).
func splitID(id string) (string, int) {
	t, n := id[:min(len(id), len(idLayout))], 1
	if rest, ok := strings.CutPrefix(id[len(t):], "-"); ok {
		n, _ = strconv.Atoi(rest)
	}
	return t, n
}

// Open opens the backup id of the database uid; ErrNotFound when it has none.
func (s *Store) Open(uid, id string) (io.ReadCloser, Backup, error) {
	if !ValidID(id) {
		return nil, Backup{}, ErrNotFound
	}
	list, err := s.List(uid)
	if err != nil {
		return nil, Backup{}, err
	}
	i := slices.IndexFunc(list, func(b Backup) bool { return b.ID == id })
	if i < 0 {
		return nil, Backup{}, ErrNotFound
	}
	dir, _ := s.dir(uid)
	f, err := os.OpenFile(filepath.Join(dir, id+"."+string(list[i].Kind)+".dump"), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Backup{}, ErrNotFound
	}
	if err != nil {
		return nil, Backup{}, err
	}
	return f, list[i], nil
}

// Prune removes the oldest backups beyond the newest keep, and returns them.
func (s *Store) Prune(uid string, keep int) ([]Backup, error) {
	list, err := s.List(uid)
	if err != nil || len(list) <= keep {
		return nil, err
	}
	dir, _ := s.dir(uid)
	gone := list[max(keep, 0):]
	for _, b := range gone {
		if err := os.Remove(filepath.Join(dir, b.ID+"."+string(b.Kind)+".dump")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return gone, syncDir(dir)
}

// Remove deletes every backup of the database uid.
func (s *Store) Remove(uid string) error {
	dir, err := s.dir(uid)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// SweepGrace is how old a directory must be before Sweep removes it for a
// database live does not know: one made after the caller listed the
// databases is not swept.
const SweepGrace = 10 * time.Minute

// Sweep removes the backups of databases that are gone (live says which UIDs
// are not), and with tmps the temporary files a crash left (only at a time
// when no backup is being written: the server's start).
func (s *Store) Sweep(live func(uid string) bool, tmps bool) error {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(s.Dir, e.Name())
		if !uidPattern.MatchString(e.Name()) || !e.IsDir() {
			continue
		}
		if !live(e.Name()) {
			if info, err := e.Info(); err == nil && s.now().Sub(info.ModTime()) > SweepGrace {
				errs = append(errs, os.RemoveAll(dir))
			}
			continue
		}
		if tmps {
			found, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
			for _, t := range found {
				errs = append(errs, os.Remove(t))
			}
		}
	}
	return errors.Join(errs...)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
