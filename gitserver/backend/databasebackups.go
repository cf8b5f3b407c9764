package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/dbbackups"
)

// Backups kept on the server: postgres:backups, postgres:backups:capture,
// the schedule (spec.backups: default daily, 7 kept) and postgres:restore
// --backup ID. The dumps are the same as postgres:backup's (pg_dump's custom
// format, from a one-off beside the database), kept by a dbbackups.Store
// under the Database's UID.

// DefaultBackupSchedule and DefaultBackupsKept are spec.backups' defaults.
const (
	DefaultBackupSchedule = "@daily"
	DefaultBackupsKept    = 7
)

// backupRetry is how long a scheduled backup that failed waits before it is
// tried again.
const backupRetry = 10 * time.Minute

// BackupsInfo is a database's backups, as postgres:backups shows them.
type BackupsInfo struct {
	Database string `json:"database"`
	// Schedule is the cron expression (UTC) backups are taken on.
	Schedule string `json:"schedule"`
	// Keep is how many backups are kept, captured and scheduled together.
	Keep int32 `json:"keep"`
	// Next is when the schedule takes the next one; null when the schedule
	// is not valid (ScheduleError says why).
	Next          *time.Time `json:"next"`
	ScheduleError string     `json:"scheduleError,omitempty"`
	// Backups are newest first.
	Backups []dbbackups.Backup `json:"backups"`
}

// backupPolicy is db's schedule and how many to keep, defaults included.
func backupPolicy(db *appv1.Database) (string, int32) {
	schedule, keep := DefaultBackupSchedule, int32(DefaultBackupsKept)
	if bk := db.Spec.Backups; bk != nil {
		if bk.Schedule != "" {
			schedule = bk.Schedule
		}
		if bk.Keep > 0 {
			keep = bk.Keep
		}
	}
	return schedule, keep
}

// nextBackup is when db's schedule is due after its newest backup (its
// creation when it has none).
func nextBackup(db *appv1.Database, newest []dbbackups.Backup) (time.Time, error) {
	expr, _ := backupPolicy(db)
	sched, err := cronParser.Parse(expr)
	if err != nil {
		return time.Time{}, fmt.Errorf("the backup schedule %q is not a cron expression (five fields or @daily): %v", expr, err)
	}
	last := db.CreationTimestamp.UTC()
	if len(newest) > 0 {
		last = newest[0].Created
	}
	return sched.Next(last), nil
}

func (b *Backend) backupStore() (*dbbackups.Store, error) {
	if b.cfg.Backups == nil {
		return nil, Errorf(Invalid, "this server keeps no backups: postgres:backup NAME > FILE writes one where you are")
	}
	return b.cfg.Backups, nil
}

// DatabaseBackups lists the backups kept of a Postgres database u may use.
func (b *Backend) DatabaseBackups(ctx context.Context, u *User, name string) (*BackupsInfo, error) {
	db, err := b.database(ctx, u, appv1.EnginePostgres, name)
	if err != nil {
		return nil, err
	}
	store, err := b.backupStore()
	if err != nil {
		return nil, err
	}
	list, err := store.List(string(db.UID))
	if err != nil {
		return nil, fmt.Errorf("listing the backups of %s: %w", name, err)
	}
	schedule, keep := backupPolicy(db)
	in := &BackupsInfo{Database: name, Schedule: schedule, Keep: keep, Backups: list}
	if next, err := nextBackup(db, list); err != nil {
		in.ScheduleError = err.Error()
	} else {
		in.Next = &next
	}
	return in, nil
}

// CaptureDatabaseBackup takes a backup of a Postgres database u may use now
// and keeps it on the server; the oldest beyond the database's keep go.
// pg_dump's messages go to errOut.
func (b *Backend) CaptureDatabaseBackup(ctx context.Context, u *User, name string, errOut io.Writer) (*dbbackups.Backup, error) {
	if err := u.mayChange("postgres:backups:capture"); err != nil {
		return nil, err
	}
	db, err := b.database(ctx, u, appv1.EnginePostgres, name)
	if err != nil {
		return nil, err
	}
	return b.captureBackup(ctx, db, dbbackups.Captured, errOut, func(id string) {
		b.auditDatabase(u, "postgres:backups:capture", name, "id", id)
	})
}

func (b *Backend) captureBackup(ctx context.Context, db *appv1.Database, kind dbbackups.Kind, errOut io.Writer, audit func(id string)) (*dbbackups.Backup, error) {
	store, err := b.backupStore()
	if err != nil {
		return nil, err
	}
	bk, err := store.Create(string(db.UID), kind, func(w io.Writer) error {
		exit, err := b.runOnDatabase(ctx, db, "postgres:backups:capture", backupScript, DatabaseIO{Stdout: w, Stderr: errOut}, audit)
		if err != nil {
			return err
		}
		if exit != 0 {
			return Errorf(Failed, "postgres:backups:capture %s: pg_dump exited with %d: no backup was kept", db.Name, exit)
		}
		return nil
	})
	if errors.Is(err, dbbackups.ErrDiskFull) {
		return nil, Errorf(Failed, "postgres:backups:capture %s: %v; nothing was kept: system:df shows what takes it, postgres:backup %s > FILE writes one where you are", db.Name, err, db.Name)
	}
	if err != nil {
		return nil, err
	}
	_, keep := backupPolicy(db)
	if _, err := store.Prune(string(db.UID), int(keep)); err != nil {
		b.log.Error("pruning database backups", "database", db.Name, "err", err)
	}
	return &bk, nil
}

// RestoreDatabaseBackup replaces a Postgres database's contents with its
// backup id, in one transaction, as RestoreDatabase does with a dump.
func (b *Backend) RestoreDatabaseBackup(ctx context.Context, u *User, name, id string, errOut io.Writer) error {
	if err := u.mayChange("postgres:restore"); err != nil {
		return err
	}
	db, err := b.database(ctx, u, appv1.EnginePostgres, name)
	if err != nil {
		return err
	}
	store, err := b.backupStore()
	if err != nil {
		return err
	}
	r, _, err := store.Open(string(db.UID), id)
	if errors.Is(err, dbbackups.ErrNotFound) {
		return Errorf(NotFound, "%s has no backup %q: postgres:backups %s lists them", name, id, name)
	}
	if err != nil {
		return fmt.Errorf("opening backup %s of %s: %w", id, name, err)
	}
	defer r.Close()
	exit, err := b.runOnDatabase(ctx, db, "postgres:restore", restoreScript, DatabaseIO{Stdin: r, Stdout: errOut, Stderr: errOut},
		func(run string) { b.auditDatabase(u, "postgres:restore", name, "id", run, "backup", id) })
	if err != nil {
		return err
	}
	if exit != 0 {
		return Errorf(Failed, "postgres:restore %s --backup %s: pg_restore exited with %d, and nothing was restored: the data is as it was", name, id, exit)
	}
	return nil
}

// BackupSchedules takes the scheduled backups of every Postgres database.
type BackupSchedules struct {
	b *Backend
	// failed holds, per database UID, when its last scheduled backup failed.
	mu     sync.Mutex
	failed map[string]time.Time
}

// BackupSchedules returns the scheduler of the databases' backups; nil when
// this server keeps none or cannot run one-offs.
func (b *Backend) BackupSchedules() *BackupSchedules {
	if b.cfg.Backups == nil || b.cfg.Runner == nil {
		return nil
	}
	return &BackupSchedules{b: b, failed: map[string]time.Time{}}
}

// Run takes the backups as they fall due until ctx ends. It wakes when the
// next is due, and at least every minute to see new databases and schedules.
func (s *BackupSchedules) Run(ctx context.Context) {
	if err := s.b.cfg.Backups.Sweep(func(string) bool { return true }, true); err != nil {
		s.b.log.Error("sweeping database backups", "err", err)
	}
	for {
		next := s.Once(ctx, time.Now())
		wait := min(time.Until(next), time.Minute)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
	}
}

// Once takes the backups due at now, one at a time, removes those of
// databases that are gone, and returns when the next one is due (at most an
// hour on).
func (s *BackupSchedules) Once(ctx context.Context, now time.Time) time.Time {
	b := s.b
	earliest := now.Add(time.Hour)
	var list appv1.DatabaseList
	if err := b.cfg.Reader.List(ctx, &list, client.InNamespace(b.cfg.Namespace)); err != nil {
		b.log.Error("backup schedule: listing databases", "err", err)
		return now.Add(time.Minute)
	}
	live := map[string]bool{}
	for i := range list.Items {
		db := &list.Items[i]
		live[string(db.UID)] = true
		if db.Spec.Engine != appv1.EnginePostgres || !db.DeletionTimestamp.IsZero() || db.Status.Phase != appv1.DatabaseRunning {
			continue
		}
		backups, err := b.cfg.Backups.List(string(db.UID))
		if err != nil {
			b.log.Error("backup schedule: listing backups", "database", db.Name, "err", err)
			continue
		}
		due, err := nextBackup(db, backups)
		if err != nil {
			continue // postgres:backups says why
		}
		s.mu.Lock()
		failedAt, failed := s.failed[string(db.UID)]
		s.mu.Unlock()
		if failed && now.Before(failedAt.Add(backupRetry)) {
			due = failedAt.Add(backupRetry)
		}
		if now.Before(due) {
			earliest = minTime(earliest, due)
			continue
		}
		bk, err := b.captureBackup(ctx, db, dbbackups.Scheduled, io.Discard, func(id string) {
			b.log.Info("audit", "user", "bex", "command", "postgres:backups (schedule)", "database", db.Name, "id", id)
		})
		s.mu.Lock()
		if err != nil {
			s.failed[string(db.UID)] = now
			b.log.Error("scheduled backup failed", "database", db.Name, "err", err, "retry", backupRetry)
			earliest = minTime(earliest, now.Add(backupRetry))
		} else {
			delete(s.failed, string(db.UID))
			b.log.Info("scheduled backup taken", "database", db.Name, "backup", bk.ID, "bytes", bk.Bytes)
			if next, err := nextBackup(db, []dbbackups.Backup{*bk}); err == nil {
				earliest = minTime(earliest, next)
			}
		}
		s.mu.Unlock()
	}
	// Backups of databases that are gone (deleted with kubectl, or while this
	// server was down): a directory is only swept once it is old enough
	// that a database made since the list above cannot own it.
	if err := b.cfg.Backups.Sweep(func(uid string) bool { return live[uid] }, false); err != nil {
		b.log.Error("sweeping database backups", "err", err)
	}
	return earliest
}

func minTime(a, c time.Time) time.Time {
	if c.Before(a) {
		return c
	}
	return a
}
