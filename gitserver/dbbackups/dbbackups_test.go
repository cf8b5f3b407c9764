package dbbackups_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/gitserver/dbbackups"
)

const (
	uid   = "0b7f3c1e-2a4d-4f6e-9c8b-1d2e3f4a5b6c"
	other = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
)

// clock steps one second at each call from a fixed time.
func clock(start time.Time, step time.Duration) func() time.Time {
	now := start
	return func() time.Time { t := now; now = now.Add(step); return t }
}

func write(s string) func(io.Writer) error {
	return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
}

func read(t *testing.T, s *dbbackups.Store, uid, id string) string {
	t.Helper()
	r, _, err := s.Open(uid, id)
	if err != nil {
		t.Fatalf("Open(%s): %v", id, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, strings.TrimPrefix(p, dir+"/"))
		}
		return nil
	})
	return out
}

func TestCreateListOpenPrune(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 12, 6, 23, 15, 2, 0, time.UTC)
	s := &dbbackups.Store{Dir: dir, Now: clock(start, 0)} // every backup in the same second
	a, err := s.Create(uid, dbbackups.Captured, write("first"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Create(uid, dbbackups.Scheduled, write("second!"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Create(uid, dbbackups.Captured, write("third"))
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != "20261206-231502" || b.ID != "20261206-231502-2" || c.ID != "20261206-231502-3" {
		t.Fatalf("IDs %s %s %s: want the time, then -2, -3 within one second", a.ID, b.ID, c.ID)
	}
	if b.Bytes != 7 || b.Kind != dbbackups.Scheduled || !b.Created.Equal(start) {
		t.Fatalf("second backup %+v", b)
	}
	list, err := s.List(uid)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range list {
		ids = append(ids, x.ID)
	}
	if strings.Join(ids, " ") != "20261206-231502-3 20261206-231502-2 20261206-231502" {
		t.Fatalf("List: %v, want newest first", ids)
	}
	if got := read(t, s, uid, b.ID); got != "second!" {
		t.Fatalf("backup %s holds %q", b.ID, got)
	}
	// Another database sees none of them.
	if l, err := s.List(other); err != nil || len(l) != 0 {
		t.Fatalf("another database's List: %v %v", l, err)
	}
	if _, _, err := s.Open(other, a.ID); !errors.Is(err, dbbackups.ErrNotFound) {
		t.Fatalf("another database opened %s: %v", a.ID, err)
	}
	gone, err := s.Prune(uid, 2)
	if err != nil || len(gone) != 1 || gone[0].ID != a.ID {
		t.Fatalf("Prune(2) removed %v (%v), want the oldest alone", gone, err)
	}
	if _, _, err := s.Open(uid, a.ID); !errors.Is(err, dbbackups.ErrNotFound) {
		t.Fatalf("a pruned backup opens: %v", err)
	}
	if err := s.Remove(uid); err != nil {
		t.Fatal(err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("Remove left %v", f)
	}
}

func TestNamesThatAreNotBackupsReachNoPath(t *testing.T) {
	dir := t.TempDir()
	s := &dbbackups.Store{Dir: dir}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("not yours"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(uid, dbbackups.Captured, write("x")); err != nil {
		t.Fatal(err)
	}
	// A link named like a backup is not one.
	if err := os.Symlink(secret, filepath.Join(dir, uid, "20200101-000000.captured.dump")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"../secret", "20200101-000000", "20200101-000000/../../secret", "", "x"} {
		if _, _, err := s.Open(uid, id); !errors.Is(err, dbbackups.ErrNotFound) {
			t.Errorf("Open(%q): %v, want ErrNotFound", id, err)
		}
	}
	for _, bad := range []string{"../x", "shop", uid + "/..", ""} {
		if _, err := s.List(bad); err == nil {
			t.Errorf("List(%q) took it as a UID", bad)
		}
		if _, err := s.Create(bad, dbbackups.Captured, write("x")); err == nil {
			t.Errorf("Create(%q) took it as a UID", bad)
		}
	}
	if l, _ := s.List(uid); len(l) != 1 {
		t.Fatalf("List shows %v: the link is not a backup", l)
	}
}

func TestAFailedDumpLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s := &dbbackups.Store{Dir: dir}
	boom := errors.New("pg_dump exited with 1")
	_, err := s.Create(uid, dbbackups.Captured, func(w io.Writer) error {
		_, _ = io.WriteString(w, "half a dump")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Create: %v", err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("a failed dump left %v", f)
	}
}

func TestTheFloorStopsADumpAndKeepsNothing(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test mounts a tmpfs: run it as root, as make test does")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "bex-dbbackups-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })

	// The floor: 2 MiB must stay free of 8; a 6 MiB dump is stopped.
	s := &dbbackups.Store{Dir: dir, MinFreeBytes: 2 << 20}
	chunk := bytes.Repeat([]byte("d"), 64<<10)
	_, err := s.Create(uid, dbbackups.Scheduled, func(w io.Writer) error {
		for range 96 {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, dbbackups.ErrDiskFull) {
		t.Fatalf("a dump past the floor: %v, want ErrDiskFull", err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("a stopped dump left %v", f)
	}
	// Without a floor, the file system's own end (ENOSPC) is the same error.
	s.MinFreeBytes = 0
	_, err = s.Create(uid, dbbackups.Scheduled, func(w io.Writer) error {
		for range 160 {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, dbbackups.ErrDiskFull) {
		t.Fatalf("a dump past the disk's end: %v, want ErrDiskFull", err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("a dump that filled the disk left %v", f)
	}
	// And a small one still fits afterwards.
	if _, err := s.Create(uid, dbbackups.Captured, write("small")); err != nil {
		t.Fatalf("a small dump after a full disk: %v", err)
	}
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	s := &dbbackups.Store{Dir: dir, Now: func() time.Time { return now }}
	for _, u := range []string{uid, other} {
		if _, err := s.Create(u, dbbackups.Captured, write("x")); err != nil {
			t.Fatal(err)
		}
	}
	// What a crash in the middle of a dump leaves.
	if err := os.WriteFile(filepath.Join(dir, uid, ".tmp-123"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	onlyUID := func(u string) bool { return u == uid }
	// A directory younger than the grace may be a database's made after the
	// caller's list: it stays. So do the temporary files, without tmps.
	if err := s.Sweep(onlyUID, false); err != nil {
		t.Fatal(err)
	}
	if f := files(t, dir); len(f) != 3 {
		t.Fatalf("a sweep within the grace removed some of %v", f)
	}
	now = now.Add(dbbackups.SweepGrace + time.Minute)
	if err := s.Sweep(onlyUID, true); err != nil {
		t.Fatal(err)
	}
	f := files(t, dir)
	if len(f) != 1 || !strings.HasPrefix(f[0], uid+"/") || !strings.HasSuffix(f[0], ".captured.dump") {
		t.Fatalf("after Sweep: %v, want the live database's backup alone", f)
	}
}

// TestDumpsEndingInTheSameSecondTakeTwoIDs: a capture and the schedule that
// end at once never share an ID (nor fail for it).
func TestDumpsEndingInTheSameSecondTakeTwoIDs(t *testing.T) {
	s := &dbbackups.Store{Dir: t.TempDir(), Now: func() time.Time { return time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC) }}
	errs := make(chan error, 16)
	for i := range 16 {
		kind := dbbackups.Captured
		if i%2 == 1 {
			kind = dbbackups.Scheduled
		}
		go func() { _, err := s.Create(uid, kind, write("x")); errs <- err }()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.List(uid)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, b := range list {
		ids[b.ID] = true
	}
	if len(list) != 16 || len(ids) != 16 {
		t.Fatalf("16 dumps in one second: %d backups, %d IDs", len(list), len(ids))
	}
}
