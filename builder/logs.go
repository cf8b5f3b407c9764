package builder

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// logStore keeps the last builds' logs of each app as files
// <dir>/<app>/<unix nanoseconds>-<commit>.log, each bounded in size.
type logStore struct {
	dir      string
	keep     int
	maxBytes int64
}

// BuildLog names one stored build log.
type BuildLog struct {
	ID     string // the file name without .log
	Commit string
	Time   time.Time
}

func (s *logStore) create(app, commit string) (*boundedFile, error) {
	dir := filepath.Join(s.dir, app)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%d-%s.log", time.Now().UnixNano(), commit)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return nil, err
	}
	s.prune(app)
	return &boundedFile{f: f, left: s.maxBytes}, nil
}

// List returns app's stored logs, newest first.
func (s *logStore) List(app string) ([]BuildLog, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, app))
	if os.IsNotExist(err) {
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
		var ns int64
		var commit string
		if _, err := fmt.Sscanf(strings.Replace(id, "-", " ", 1), "%d %s", &ns, &commit); err != nil {
			continue
		}
		logs = append(logs, BuildLog{ID: id, Commit: commit, Time: time.Unix(0, ns)})
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].Time.After(logs[j].Time) })
	return logs, nil
}

func (s *logStore) prune(app string) {
	logs, err := s.List(app)
	if err != nil {
		return
	}
	for _, l := range logs[min(len(logs), s.keep):] {
		_ = os.Remove(filepath.Join(s.dir, app, l.ID+".log"))
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
