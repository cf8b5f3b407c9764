package builder

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Outcome is how a build ended, or that it has not yet.
type Outcome string

// The outcomes of a build.
const (
	// OutcomeRunning: the build is in progress in this process.
	OutcomeRunning Outcome = "running"
	// OutcomeSucceeded: the build produced BuildLog.Image.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeFailed: the build failed for BuildLog.Error, or did not finish
	// because the process that ran it stopped (ErrorDidNotFinish).
	OutcomeFailed Outcome = "failed"
	// OutcomeCanceled: the caller's context ended before the build did (the pusher
	// went away, or bex is shutting down).
	OutcomeCanceled Outcome = "canceled"
)

// ErrorDidNotFinish is the Error of a build whose log has no outcome and that is
// not in progress in this process: the process that ran it stopped during it.
const ErrorDidNotFinish = "the build did not finish (bex stopped during it)"

// ErrInvalidName: an app or build id given to the log store is not a single
// file name of the form the builder writes.
var ErrInvalidName = errors.New("not a valid name")

// BuildLog is one stored build: its log and its outcome.
type BuildLog struct {
	// ID names the build among the app's: <unix nanoseconds>-<commit>.
	ID     string    `json:"id"`
	Commit string    `json:"commit"`
	Time   time.Time `json:"time"` // when the build began
	// Outcome is recorded by the builder when the build ends.
	Outcome Outcome `json:"outcome"`
	// Finished is when the build ended; zero while it runs. For a build that
	// did not finish it is the time of its log's last write.
	Finished time.Time `json:"finished,omitzero"`
	// Error is, for a failed build, the one-line reason the pusher was shown.
	Error string `json:"error,omitempty"`
	// Image is, for a succeeded build, the digest-pinned image it produced.
	Image string `json:"image,omitempty"`
}

// outcomeRecord is the sidecar <id>.json the builder writes when a build ends; the
// rest of a BuildLog is in the log's file name.
type outcomeRecord struct {
	Outcome  Outcome   `json:"outcome"`
	Finished time.Time `json:"finished"`
	Error    string    `json:"error,omitempty"`
	Image    string    `json:"image,omitempty"`
}

// logStore keeps the last builds of each app as files <dir>/<app>/<id>.log, each
// bounded in size, and beside each finished build's log its outcome as <id>.json,
// written atomically when the build ends. A log without an outcome is running when
// its build is in flight in this store, and otherwise one whose build died with
// the process that ran it: only the process that runs the builds reads them.
type logStore struct {
	dir      string
	keep     int
	maxBytes int64

	mu       sync.Mutex
	inFlight map[string]struct{} // app + "/" + id
}

var (
	idRE = regexp.MustCompile(`^([0-9]{1,19})-([0-9a-f]{40})$`)
)

// checkApp keeps an app name the API's (appv1.ValidAppName): a DNS label, so
// a single path element.
func checkApp(app string) error {
	if !appv1.ValidAppName(app) {
		return fmt.Errorf("app %q: %w", app, ErrInvalidName)
	}
	return nil
}

// parseID checks a build id and returns the time and commit it names.
func parseID(id string) (time.Time, string, error) {
	m := idRE.FindStringSubmatch(id)
	if m == nil {
		return time.Time{}, "", fmt.Errorf("build id %q: %w", id, ErrInvalidName)
	}
	ns, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("build id %q: %w", id, ErrInvalidName)
	}
	return time.Unix(0, ns), m[2], nil
}

// buildFile is the log of a build in progress; finish records its outcome.
type buildFile struct {
	*boundedFile
	app, id string
}

func (s *logStore) create(app, commit string) (*buildFile, error) {
	if err := checkApp(app); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, app)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%d-%s", time.Now().UnixNano(), commit)
	if _, _, err := parseID(id); err != nil {
		return nil, err
	}
	// In flight before the file exists: a reader never sees this log without an
	// outcome and not in flight while the build runs.
	s.setInFlight(app, id, true)
	f, err := os.OpenFile(filepath.Join(dir, id+".log"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		s.setInFlight(app, id, false)
		return nil, err
	}
	s.prune(app)
	return &buildFile{boundedFile: &boundedFile{f: f, left: s.maxBytes}, app: app, id: id}, nil
}

func (s *logStore) setInFlight(app, id string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight == nil {
		s.inFlight = map[string]struct{}{}
	}
	if on {
		s.inFlight[app+"/"+id] = struct{}{}
	} else {
		delete(s.inFlight, app+"/"+id)
	}
}

func (s *logStore) running(app, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.inFlight[app+"/"+id]
	return ok
}

// finish records the outcome of f's build, then takes it out of flight (in that
// order, so that a reader always finds one or the other). The outcome is written
// to a temporary file and renamed into place: a reader or a crash sees no outcome
// or all of it. When it cannot be written the build reads as not finished.
func (s *logStore) finish(f *buildFile, rec outcomeRecord) error {
	defer s.setInFlight(f.app, f.id, false)
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, f.app)
	tmp, err := os.CreateTemp(dir, f.id+".json.tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, f.id+".json"))
}

// List returns app's stored builds, newest first.
func (s *logStore) List(app string) ([]BuildLog, error) {
	if err := checkApp(app); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, app))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var logs []BuildLog
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		l, err := s.read(app, id)
		if errors.Is(err, ErrInvalidName) || errors.Is(err, fs.ErrNotExist) {
			continue // not a log the builder wrote, or pruned meanwhile
		}
		if err != nil {
			return nil, err
		}
		logs = append(logs, l)
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].Time.After(logs[j].Time) })
	return logs, nil
}

// Build returns one stored build of app; an unknown id is an error wrapping
// fs.ErrNotExist, an app or id that is not a name one wrapping ErrInvalidName.
func (s *logStore) Build(app, id string) (BuildLog, error) {
	if err := checkApp(app); err != nil {
		return BuildLog{}, err
	}
	return s.read(app, id)
}

func (s *logStore) read(app, id string) (BuildLog, error) {
	t, commit, err := parseID(id)
	if err != nil {
		return BuildLog{}, err
	}
	l := BuildLog{ID: id, Commit: commit, Time: t}
	// In flight is asked before the outcome is read: finish writes the outcome
	// before it takes the build out of flight, so a build seen not in flight
	// has its outcome on disk if it ever finished here.
	running := s.running(app, id)
	base := filepath.Join(s.dir, app, id)
	info, err := os.Stat(base + ".log")
	if err != nil {
		return BuildLog{}, fmt.Errorf("build %s of %s: %w", id, app, err)
	}
	data, err := os.ReadFile(base + ".json")
	switch {
	case err == nil:
		var rec outcomeRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return BuildLog{}, fmt.Errorf("the outcome of build %s of %s: %w", id, app, err)
		}
		l.Outcome, l.Finished, l.Error, l.Image = rec.Outcome, rec.Finished, rec.Error, rec.Image
	case !errors.Is(err, fs.ErrNotExist):
		return BuildLog{}, err
	case running:
		l.Outcome = OutcomeRunning
	default:
		l.Outcome, l.Error, l.Finished = OutcomeFailed, ErrorDidNotFinish, info.ModTime()
	}
	return l, nil
}

// open opens one stored build's log.
func (s *logStore) open(app, id string) (*os.File, error) {
	if err := checkApp(app); err != nil {
		return nil, err
	}
	if _, _, err := parseID(id); err != nil {
		return nil, err
	}
	return os.Open(filepath.Join(s.dir, app, id+".log"))
}

// remove deletes every stored build of app (apps:destroy): an app made later
// under the same name, by anyone, must not read the old one's build output.
func (s *logStore) remove(app string) error {
	if err := checkApp(app); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(s.dir, app))
}

// prune removes all but the newest keep builds of app (never one in flight: it
// is removed by a later prune), and outcomes and temporary files left without
// their log.
func (s *logStore) prune(app string) {
	logs, err := s.List(app)
	if err != nil {
		return
	}
	dir := filepath.Join(s.dir, app)
	kept := map[string]bool{}
	for i, l := range logs {
		if i < s.keep || s.running(app, l.ID) {
			kept[l.ID] = true
			continue
		}
		_ = os.Remove(filepath.Join(dir, l.ID+".log"))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".log") {
			continue
		}
		id, _, _ := strings.Cut(name, ".")
		// A build in flight may be writing its outcome's temporary file now.
		if _, _, err := parseID(id); err == nil && !kept[id] && !s.running(app, id) {
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
}

// boundedFile writes up to a limit, then one line saying the log was cut, then
// nothing: a runaway build cannot fill the disk.
type boundedFile struct {
	mu   sync.Mutex
	f    *os.File
	left int64
	cut  bool
}

func (b *boundedFile) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		return len(p), nil
	}
	if int64(len(p)) > b.left {
		_, _ = b.f.Write(p[:b.left])
		_, _ = b.f.WriteString("\n[the build log was cut here: it reached its size limit]\n")
		b.cut = true
		return len(p), nil
	}
	b.left -= int64(len(p))
	_, err := b.f.Write(p)
	return len(p), err
}

func (b *boundedFile) Close() error { return b.f.Close() }
