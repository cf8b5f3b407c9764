package backend_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/dbbackups"
)

// dumpRunner plays pg_dump and pg_restore: a dump writes "dump N of the
// database" (or fails with exit), a restore records what it read.
type dumpRunner struct {
	mu       sync.Mutex
	dumps    int
	restored []string
	exit     int
}

func (r *dumpRunner) Run(_ context.Context, s backend.RunSpec) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case strings.Contains(s.Command[2], "pg_dump"):
		if r.exit != 0 {
			fmt.Fprint(s.Stdout, "half")
			return r.exit, nil
		}
		r.dumps++
		fmt.Fprintf(s.Stdout, "dump %d of %s", r.dumps, strings.TrimSuffix(s.App.Name, ".db"))
	case strings.Contains(s.Command[2], "pg_restore"):
		b, _ := io.ReadAll(s.Stdin)
		r.restored = append(r.restored, string(b))
	}
	return r.exit, nil
}

func (r *dumpRunner) Start(context.Context, backend.RunSpec, func(int)) error {
	panic("a database's one-off is never detached")
}

// withUID gives db a UID as the API server makes them.
func withUID(db *appv1.Database, uid string) *appv1.Database {
	db.UID = types.UID(uid)
	return db
}

func TestDatabaseBackupsOnTheServer(t *testing.T) {
	r := &dumpRunner{}
	dir := t.TempDir()
	created := time.Date(2026, 12, 6, 21, 30, 0, 0, time.UTC)
	// The captures below are taken an hour after the database was made,
	// whatever the wall clock says.
	store := &dbbackups.Store{Dir: dir, Now: func() time.Time { return created.Add(time.Hour) }}
	shop := withUID(database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob"), "11111111-2222-4333-8444-555555555555")
	shop.CreationTimestamp = metav1.NewTime(created)
	shop.Spec.Backups = &appv1.DatabaseBackups{Keep: 2}
	theirs := withUID(database("theirs", appv1.EnginePostgres, appv1.DatabaseRunning, "carol"), "66666666-7777-4888-9999-aaaaaaaaaaaa")
	cache := withUID(database("cache", appv1.EngineRedis, appv1.DatabaseRunning, "bob"), "bbbbbbbb-cccc-4ddd-8eee-ffffffffffff")
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner, c.Backups = r, store }, shop, credentials("shop"), theirs, credentials("theirs"), cache)
	ctx := context.Background()

	in, err := f.b.DatabaseBackups(ctx, member, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if in.Schedule != "@daily" || in.Keep != 2 || len(in.Backups) != 0 || in.Next == nil || !in.Next.Equal(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("a new database's backups: %+v", in)
	}

	bk, err := f.b.CaptureDatabaseBackup(ctx, member, "shop", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if bk.Kind != dbbackups.Captured || bk.Bytes != int64(len("dump 1 of shop")) {
		t.Fatalf("captured %+v", bk)
	}
	if err := f.b.RestoreDatabaseBackup(ctx, member, "shop", bk.ID, io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(r.restored) != 1 || r.restored[0] != "dump 1 of shop" {
		t.Fatalf("the restore read %q, want the backup's bytes", r.restored)
	}

	// Another user's database, and one that does not exist, are answered
	// alike; an ID that is not one of the database's is one line.
	for _, call := range []func() error{
		func() error { _, err := f.b.DatabaseBackups(ctx, member, "theirs"); return err },
		func() error { _, err := f.b.CaptureDatabaseBackup(ctx, member, "theirs", io.Discard); return err },
		func() error { return f.b.RestoreDatabaseBackup(ctx, member, "theirs", bk.ID, io.Discard) },
		func() error { _, err := f.b.DatabaseBackups(ctx, member, "nope"); return err },
	} {
		wantKind(t, "someone else's database", call(), backend.NotFound, "postgres:list shows the ones you can use")
	}
	wantKind(t, "redis", func() error { _, err := f.b.CaptureDatabaseBackup(ctx, member, "cache", io.Discard); return err }(),
		backend.NotFound, "cache is a redis database")
	for _, id := range []string{"../../etc/passwd", "20261206-000000", ""} {
		wantKind(t, "restore --backup "+id, f.b.RestoreDatabaseBackup(ctx, member, "shop", id, io.Discard), backend.NotFound, "postgres:backups shop lists them")
	}
	// The other database's backup is not this one's, even by its ID.
	tb, err := f.b.CaptureDatabaseBackup(ctx, &backend.User{Name: "carol"}, "theirs", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if tb.ID != bk.ID {
		wantKind(t, "another database's backup", f.b.RestoreDatabaseBackup(ctx, member, "shop", tb.ID, io.Discard), backend.NotFound, "has no backup")
	}

	// A pg_dump that fails keeps nothing.
	r.exit = 1
	_, err = f.b.CaptureDatabaseBackup(ctx, member, "shop", io.Discard)
	wantKind(t, "a failed pg_dump", err, backend.Failed, "no backup was kept")
	r.exit = 0
	if in, _ := f.b.DatabaseBackups(ctx, member, "shop"); len(in.Backups) != 1 {
		t.Fatalf("after a failed dump: %+v", in.Backups)
	}

	// The schedule: nothing before midnight, one at midnight, none again
	// until the next; two kept.
	sched := f.b.BackupSchedules()
	next := sched.Once(ctx, created.Add(2*time.Hour+15*time.Minute))
	if in, _ := f.b.DatabaseBackups(ctx, member, "shop"); len(in.Backups) != 1 {
		t.Fatalf("the schedule took one before it was due: %+v", in.Backups)
	}
	if !next.Equal(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("next due %v, want midnight", next)
	}
	midnight := time.Date(2026, 12, 7, 0, 0, 5, 0, time.UTC)
	store.Now = func() time.Time { return midnight }
	sched.Once(ctx, midnight)
	sched.Once(ctx, midnight.Add(time.Minute))
	in, _ = f.b.DatabaseBackups(ctx, member, "shop")
	if len(in.Backups) != 2 || in.Backups[0].Kind != dbbackups.Scheduled || in.Backups[1].ID != bk.ID {
		t.Fatalf("after midnight: %+v", in.Backups)
	}
	day2 := midnight.Add(24 * time.Hour)
	store.Now = func() time.Time { return day2 }
	sched.Once(ctx, day2)
	in, _ = f.b.DatabaseBackups(ctx, member, "shop")
	if len(in.Backups) != 2 || in.Backups[0].Created != day2.Truncate(time.Second) || in.Backups[1].Kind != dbbackups.Scheduled {
		t.Fatalf("keep 2: %+v", in.Backups)
	}

	// A schedule that is not cron is said, and takes nothing.
	bad := shop.DeepCopy()
	bad.Spec.Backups = &appv1.DatabaseBackups{Schedule: "every day"}
	if err := f.c.Update(ctx, withRV(t, f, bad)); err != nil {
		t.Fatal(err)
	}
	in, _ = f.b.DatabaseBackups(ctx, member, "shop")
	if in.Next != nil || !strings.Contains(in.ScheduleError, `"every day" is not a cron expression`) {
		t.Fatalf("a bad schedule: %+v", in)
	}
	dumps := r.dumps
	sched.Once(ctx, day2.Add(48*time.Hour))
	if r.dumps != dumps+1 { // theirs is due; shop is not
		t.Fatalf("with a bad schedule, %d dumps were taken, want theirs alone", r.dumps-dumps)
	}

	// destroy takes the backups along.
	if err := f.b.DestroyDatabase(ctx, member, appv1.EnginePostgres, "shop", "shop"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir + "/" + string(shop.UID)); !os.IsNotExist(err) {
		t.Fatalf("the destroyed database's backups: %v", err)
	}
}

// withRV gives db the resource version it has in the fixture.
func withRV(t *testing.T, f *fixture, db *appv1.Database) *appv1.Database {
	t.Helper()
	cur := &appv1.Database{}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: db.Namespace, Name: db.Name}, cur); err != nil {
		t.Fatal(err)
	}
	db.ResourceVersion = cur.ResourceVersion
	return db
}

func TestNoBackupStoreIsOneLine(t *testing.T) {
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner = &dumpRunner{} },
		withUID(database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob"), "11111111-2222-4333-8444-555555555555"), credentials("shop"))
	_, err := f.b.CaptureDatabaseBackup(context.Background(), member, "shop", io.Discard)
	wantKind(t, "no store", err, backend.Invalid, "this server keeps no backups")
	if f.b.BackupSchedules() != nil {
		t.Fatal("a scheduler without a store")
	}
}
