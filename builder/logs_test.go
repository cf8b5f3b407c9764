package builder

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	commitA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	commitB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func newStore(dir string, keep int) *logStore {
	return &logStore{dir: dir, keep: keep, maxBytes: 1 << 10}
}

func mustCreate(t *testing.T, s *logStore, app, commit string) *buildFile {
	t.Helper()
	f, err := s.create(app, commit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func mustRead(t *testing.T, s *logStore, app, id string) BuildLog {
	t.Helper()
	l, err := s.Build(app, id)
	if err != nil {
		t.Fatalf("Build(%s, %s): %v", app, id, err)
	}
	return l
}

// A build that dies with its process leaves a log without an outcome: the next
// process's store must not say it runs forever.
func TestABuildThatDiedWithItsProcessReadsAsFailed(t *testing.T) {
	dir := t.TempDir()
	before := newStore(dir, 5)
	f := mustCreate(t, before, "app", commitA)
	if _, err := f.Write([]byte("-----> [1/2] FROM busybox\n")); err != nil {
		t.Fatal(err)
	}
	if l := mustRead(t, before, "app", f.id); l.Outcome != OutcomeRunning {
		t.Fatalf("in the process that runs it: %+v; want running", l)
	}
	info, err := os.Stat(filepath.Join(dir, "app", f.id+".log"))
	if err != nil {
		t.Fatal(err)
	}

	after := newStore(dir, 5) // the process restarted; the build is in flight nowhere
	l := mustRead(t, after, "app", f.id)
	if l.Outcome != OutcomeFailed || l.Error != ErrorDidNotFinish || !l.Finished.Equal(info.ModTime()) || l.Commit != commitA {
		t.Fatalf("after a restart: %+v; want failed with %q at the log's last write %s", l, ErrorDidNotFinish, info.ModTime())
	}
	logs, err := after.List("app")
	if err != nil || len(logs) != 1 || logs[0] != l {
		t.Fatalf("List = %+v, %v; want [%+v]", logs, err, l)
	}
}

func TestFinishRecordsTheOutcomeAtomically(t *testing.T) {
	dir := t.TempDir()
	s := newStore(dir, 5)
	f := mustCreate(t, s, "app", commitA)
	end := time.Now().Round(0)
	if err := s.finish(f, outcomeRecord{Outcome: OutcomeFailed, Finished: end, Error: "step x failed with exit code 1"}); err != nil {
		t.Fatal(err)
	}
	l := mustRead(t, s, "app", f.id)
	if l.Outcome != OutcomeFailed || l.Error != "step x failed with exit code 1" || !l.Finished.Equal(end) {
		t.Fatalf("record = %+v", l)
	}
	// No temporary file is left, and nothing but the log and its outcome.
	entries, err := os.ReadDir(filepath.Join(dir, "app"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{f.id + ".json", f.id + ".log"}; !slices.Equal(names, want) {
		t.Fatalf("files = %v; want %v", names, want)
	}
	// Once finished, a restart does not change the record.
	if l2 := mustRead(t, newStore(dir, 5), "app", f.id); l2 != l {
		t.Fatalf("after a restart %+v, before %+v", l2, l)
	}
}

func TestPruneKeepsBuildsInFlightAndRemovesOutcomesWithTheirLogs(t *testing.T) {
	dir := t.TempDir()
	s := newStore(dir, 1)
	running := mustCreate(t, s, "app", commitA)
	done := mustCreate(t, s, "app", commitB) // keep 1: the older one runs, so it stays
	if err := s.finish(done, outcomeRecord{Outcome: OutcomeSucceeded, Finished: time.Now()}); err != nil {
		t.Fatal(err)
	}
	logs, err := s.List("app")
	if err != nil || len(logs) != 2 || logs[0].ID != done.id || logs[1].ID != running.id || logs[1].Outcome != OutcomeRunning {
		t.Fatalf("List = %+v, %v; want the finished build and the running one", logs, err)
	}
	if err := s.finish(running, outcomeRecord{Outcome: OutcomeCanceled, Finished: time.Now()}); err != nil {
		t.Fatal(err)
	}
	third := mustCreate(t, s, "app", commitA)
	// Only the newest (in flight) is kept now; the others go with their outcomes.
	entries, err := os.ReadDir(filepath.Join(dir, "app"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{third.id + ".log"}; !slices.Equal(names, want) {
		t.Fatalf("files after prune = %v; want %v", names, want)
	}
}

func TestStoreChecksNamesBeforeTheFileSystem(t *testing.T) {
	dir := t.TempDir()
	s := newStore(filepath.Join(dir, "logs"), 5)
	for _, app := range []string{"", ".", "..", "../x", "a/b", `a\b`, "a\x00b", "A", strings.Repeat("a", 64)} {
		if _, err := s.create(app, commitA); !errors.Is(err, ErrInvalidName) {
			t.Errorf("create(%q) = %v; want ErrInvalidName", app, err)
		}
		if _, err := s.List(app); !errors.Is(err, ErrInvalidName) {
			t.Errorf("List(%q) = %v; want ErrInvalidName", app, err)
		}
	}
	// Nothing was created, not even the store's own directory.
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("the names touched the file system: %v, %v", entries, err)
	}
	for _, id := range []string{"", "1-" + commitA[:39], "x-" + commitA, "1-" + commitA + ".log", "../1-" + commitA, "1-" + commitA + "/"} {
		if _, err := s.Build("app", id); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Build(app, %q) = %v; want ErrInvalidName", id, err)
		}
	}
	if _, err := s.Build("app", "1-"+commitA); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Build of an unknown id = %v; want fs.ErrNotExist", err)
	}
}

func TestHeadlineIsOneLine(t *testing.T) {
	step := &stepError{step: "[2/2] RUN make", code: "exit code 2", tail: []string{"make: *** [all] Error 2"}}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{step, "step [2/2] RUN make failed with exit code 2"},
		{errors.Join(errors.New("first"), errors.New("second")), "first"},
		{ErrTimeout, "build timed out"},
	} {
		if got := headline(tc.err); got != tc.want {
			t.Errorf("headline(%q) = %q; want %q", tc.err, got, tc.want)
		}
	}
}

// apps:destroy removes an app's builds: an app made later under the same name (by
// anyone) lists none of them. Another app's stay; a name that is not an app's is
// refused rather than joined to the directory.
func TestRemoveDeletesOnlyThatAppsBuilds(t *testing.T) {
	dir := t.TempDir()
	s := newStore(dir, 5)
	mustCreate(t, s, "gone", commitA).Close()
	mustCreate(t, s, "kept", commitB).Close()
	if err := s.remove("gone"); err != nil {
		t.Fatal(err)
	}
	if logs, err := s.List("gone"); err != nil || len(logs) != 0 {
		t.Errorf("after remove, List(gone) = %v, %v; want none", logs, err)
	}
	if logs, err := s.List("kept"); err != nil || len(logs) != 1 {
		t.Errorf("List(kept) = %v, %v; want its one build", logs, err)
	}
	for _, bad := range []string{"..", "../kept", "a/b", ""} {
		if err := s.remove(bad); err == nil {
			t.Errorf("remove(%q) was accepted", bad)
		}
	}
	if logs, _ := s.List("kept"); len(logs) != 1 {
		t.Errorf("a refused remove touched another app's builds: %v", logs)
	}
}
