package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
	// The binary carries the zone database: TZ=Europe/Paris works on a host
	// without /usr/share/zoneinfo (a minimal image); the host's is used first.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// Clock is the scheduler's time: the real one in production, a fake one in
// tests (robfig/cron's own runner has none, so only its parser and
// Schedule.Next are used, and the waiting is the scheduler's loop).
type Clock interface {
	Now() time.Time
	// At sends the time on the channel once it is t or later (at once when t
	// has passed): an absolute time, so that a clock moved between reading Now
	// and waiting loses no run.
	At(t time.Time) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) At(t time.Time) <-chan time.Time { return time.After(time.Until(t)) }

// cronParser reads the standard 5-field schedules and the @ descriptors
// (@yearly, @monthly, @weekly, @daily, @hourly, @every <duration>).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCronSchedule parses a job's schedule in the zone tz names ("" is UTC).
func ParseCronSchedule(schedule, tz string) (cron.Schedule, error) {
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return nil, fmt.Errorf("TZ %q: %w", tz, err)
		}
		loc = l
	}
	s, err := cronParser.Parse(schedule)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", schedule, err)
	}
	if sp, ok := s.(*cron.SpecSchedule); ok {
		sp.Location = loc
	}
	return s, nil
}

// minCronPeriod bounds how often one job may start: "@every 1ms" from a
// tenant would otherwise be a fork bomb of containers.
const minCronPeriod = time.Second

// cronJob is one scheduled job of an app.
type cronJob struct {
	job     appv1.CronJob
	sched   cron.Schedule
	next    time.Time
	running map[string]context.CancelFunc // by one-off id
	status  appv1.CronJobStatus
}

// cronApp is what the scheduler runs of one app: its jobs and the release they
// run on.
type cronApp struct {
	d    runtime.Desired // App, Release, Image, Env of the last Sync
	jobs map[string]*cronJob
	seen map[string]string // job id → last cron:run token acted on
}

// cronFile is what survives a restart, by app ("namespace/name").
type cronFile struct {
	Apps map[string]cronFileApp `json:"apps"`
}

type cronFileApp struct {
	Status map[string]appv1.CronJobStatus `json:"status,omitempty"`
	Seen   map[string]string              `json:"seen,omitempty"`
}

// Scheduler runs the cron jobs of the apps a Runtime runs, each run a one-off
// (runtime.OneOffs.Start) of the app's desired release: its image and config
// vars, the default limits of a process type (a job is not one of the app's
// process types, so it does not borrow web's), Process "cron.<job id>". Its
// history (last run, exit, failures, skips) and the cron:run tokens it acted on
// are kept in a file, so that a restart neither forgets them nor runs a
// cron:run again.
type Scheduler struct {
	oneOffs runtime.OneOffs
	clock   Clock
	path    string
	log     *slog.Logger

	// startMu serializes OneOffs.Start: of two jobs due in the same second on
	// one image, the second starts on the copy of the image the first made
	// (remap.go) rather than making one beside it.
	startMu sync.Mutex

	mu     sync.Mutex
	notify func(types.NamespacedName) // a run started or ended
	apps   map[types.NamespacedName]*cronApp
	file   cronFile
	wake   chan struct{}
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

// NewScheduler starts a scheduler that keeps its state in path (created when
// missing) and runs jobs with o. clock nil is the real clock.
func NewScheduler(o runtime.OneOffs, path string, clock Clock, log *slog.Logger) (*Scheduler, error) {
	if clock == nil {
		clock = realClock{}
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Scheduler{oneOffs: o, clock: clock, path: path, log: log.With("component", "runtime/local/cron"),
		apps: map[types.NamespacedName]*cronApp{}, wake: make(chan struct{}, 1), file: cronFile{Apps: map[string]cronFileApp{}}}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &s.file); err != nil {
			return nil, fmt.Errorf("cron state %s: %w", path, err)
		}
		if s.file.Apps == nil {
			s.file.Apps = map[string]cronFileApp{}
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("cron state: %w", err)
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.loop()
	return s, nil
}

// Close stops scheduling and ends the runs going (they report nothing more).
func (s *Scheduler) Close() error {
	s.stop()
	s.wg.Wait()
	return nil
}

// Sync (re)schedules the app's jobs as d says (d.Cron; empty removes them,
// as does a suspended app) and starts one run for each cron:run token not seen
// before. It returns the jobs' status.
func (s *Scheduler) Sync(d runtime.Desired) []runtime.CronStatus {
	key := types.NamespacedName{Namespace: d.App.Namespace, Name: d.App.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.apps[key]
	if a == nil {
		saved := s.file.Apps[key.String()]
		a = &cronApp{jobs: map[string]*cronJob{}, seen: map[string]string{}}
		for id, t := range saved.Seen {
			a.seen[id] = t
		}
		for id, st := range saved.Status {
			st.Running = 0
			a.jobs[id] = &cronJob{status: st, running: map[string]context.CancelFunc{}}
		}
		s.apps[key] = a
	}
	a.d = d
	tz := appv1.CronZone(d.Env)
	now := s.clock.Now()
	want := map[string]bool{}
	jobs := d.Cron
	if d.Suspended || d.Image == "" {
		jobs = nil
	}
	for _, j := range jobs {
		want[j.ID] = true
		cj := a.jobs[j.ID]
		if cj == nil {
			cj = &cronJob{status: appv1.CronJobStatus{ID: j.ID}, running: map[string]context.CancelFunc{}}
			a.jobs[j.ID] = cj
		}
		if cj.sched == nil || cj.job != j || cj.tz() != tz {
			sched, err := ParseCronSchedule(j.Schedule, tz)
			if err != nil {
				s.log.Warn("cron job not scheduled", "app", key.String(), "job", j.ID, "err", err)
				cj.sched, cj.next = nil, time.Time{}
			} else {
				cj.sched, cj.next = sched, nextRun(sched, now)
			}
			cj.job = j
			cj.status.ID = j.ID
		}
	}
	for id, cj := range a.jobs {
		if !want[id] {
			for _, cancel := range cj.running {
				cancel()
			}
			delete(a.jobs, id)
			delete(a.seen, id)
		}
	}
	for id, token := range d.CronRuns {
		cj := a.jobs[id]
		if cj == nil || token == "" || a.seen[id] == token {
			continue
		}
		a.seen[id] = token
		if a.runningLocked() >= maxCronRunsPerApp {
			cj.status.Skipped++
			continue
		}
		s.startLocked(key, a, cj, now)
	}
	s.saveLocked(key, a)
	s.poke()
	return statusOf(a)
}

func (cj *cronJob) tz() string {
	if sp, ok := cj.sched.(*cron.SpecSchedule); ok && sp.Location != time.UTC {
		return sp.Location.String()
	}
	return ""
}

// nextRun is the schedule's next time after now, no sooner than minCronPeriod.
func nextRun(sched cron.Schedule, now time.Time) time.Time {
	n := sched.Next(now)
	if n.IsZero() {
		return n
	}
	if n.Sub(now) < minCronPeriod {
		n = now.Add(minCronPeriod)
	}
	return n
}

func statusOf(a *cronApp) []runtime.CronStatus {
	var out []runtime.CronStatus
	for _, j := range a.d.Cron {
		if cj := a.jobs[j.ID]; cj != nil {
			st := *cj.status.DeepCopy()
			st.Running = int32(len(cj.running))
			if st.LastRun != nil || st.LastExitCode != nil || st.Running > 0 || st.Skipped > 0 {
				out = append(out, st)
			}
		}
	}
	return out
}

// Status is the app's jobs' status as the last Sync scheduled them.
func (s *Scheduler) Status(key types.NamespacedName) []runtime.CronStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.apps[key]; a != nil {
		return statusOf(a)
	}
	return nil
}

// Delete stops the app's jobs and their runs and forgets their history.
func (s *Scheduler) Delete(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.apps[key]; a != nil {
		for _, cj := range a.jobs {
			for _, cancel := range cj.running {
				cancel()
			}
		}
	}
	delete(s.apps, key)
	delete(s.file.Apps, key.String())
	s.writeLocked()
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loop starts the runs that are due, then waits for the soonest next one or
// a Sync.
func (s *Scheduler) loop() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		now := s.clock.Now()
		var soonest time.Time
		for key, a := range s.apps {
			changed := false
			for _, cj := range a.jobs {
				if cj.sched == nil || cj.next.IsZero() {
					continue
				}
				if !cj.next.After(now) {
					s.dueLocked(key, a, cj, now)
					cj.next = nextRun(cj.sched, now)
					changed = true
				}
				if !cj.next.IsZero() && (soonest.IsZero() || cj.next.Before(soonest)) {
					soonest = cj.next
				}
			}
			if changed {
				s.saveLocked(key, a)
			}
		}
		s.mu.Unlock()
		var timer <-chan time.Time
		if !soonest.IsZero() {
			timer = s.clock.At(soonest)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-timer:
		}
	}
}

// maxCronRunsPerApp bounds the runs of one app going at once, whatever the
// policies say: fifty "@every 1s" jobs of "sleep 3600" with Allow would
// otherwise start containers without end. A due run over it is skipped.
const maxCronRunsPerApp = 10

func (a *cronApp) runningLocked() int {
	n := 0
	for _, cj := range a.jobs {
		n += len(cj.running)
	}
	return n
}

// dueLocked applies the job's concurrency policy to a run that is due.
func (s *Scheduler) dueLocked(key types.NamespacedName, a *cronApp, cj *cronJob, now time.Time) {
	if a.runningLocked() >= maxCronRunsPerApp && (cj.job.Policy() != appv1.CronReplace || len(cj.running) == 0) {
		cj.status.Skipped++
		s.log.Info("cron run skipped: the app has its most runs going", "app", key.String(), "job", cj.job.ID, "max", maxCronRunsPerApp)
		return
	}
	if len(cj.running) > 0 {
		switch cj.job.Policy() {
		case appv1.CronForbid:
			cj.status.Skipped++
			if s.notify != nil {
				s.notify(key)
			}
			s.log.Info("cron run skipped: the previous one still runs", "app", key.String(), "job", cj.job.ID)
			return
		case appv1.CronReplace:
			for id, cancel := range cj.running {
				cancel()
				delete(cj.running, id)
			}
		}
	}
	s.startLocked(key, a, cj, now)
}

// startLocked starts one run of cj as a one-off of the app's desired release.
func (s *Scheduler) startLocked(key types.NamespacedName, a *cronApp, cj *cronJob, now time.Time) {
	id := runtime.NewOneOffID()
	ctx, cancel := context.WithCancel(s.ctx)
	o := runtime.OneOff{App: a.d.App, ID: id, Process: "cron." + cj.job.ID, Release: a.d.Release, Image: a.d.Image,
		Command: []string{"sh", "-c", cj.job.Command}, Env: a.d.Env}
	cj.running[id] = cancel
	cj.status.LastRun = &metav1.Time{Time: now.Truncate(time.Second)}
	log := s.log.With("app", key.String(), "job", cj.job.ID, "one-off", id)
	done := func(exit int) {
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := cj.running[id]; !ok {
			return // replaced or removed: its end is no result
		}
		delete(cj.running, id)
		if s.ctx.Err() != nil && exit < 0 {
			return // the scheduler stopped
		}
		code := int32(exit)
		cj.status.LastExitCode = &code
		if exit == 0 {
			cj.status.ConsecutiveFailures = 0
		} else {
			cj.status.ConsecutiveFailures++
		}
		log.Info("cron run ended", "exit", exit)
		if s.apps[key] == a {
			s.saveLocked(key, a)
			if s.notify != nil {
				s.notify(key)
			}
		}
	}
	// Start returns once the run runs; it is not called with s.mu held by the
	// run's own done (which takes it), so it runs on its own goroutine.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.startMu.Lock()
		err := s.oneOffs.Start(ctx, o, done)
		s.startMu.Unlock()
		if err != nil {
			log.Warn("cron run did not start", "err", err)
			s.mu.Lock()
			delete(cj.running, id)
			code := int32(-1)
			cj.status.LastExitCode = &code
			cj.status.ConsecutiveFailures++
			if s.apps[key] == a {
				s.saveLocked(key, a)
			}
			s.mu.Unlock()
			cancel()
		}
	}()
}

// saveLocked writes the app's history and seen tokens to the file.
func (s *Scheduler) saveLocked(key types.NamespacedName, a *cronApp) {
	fa := cronFileApp{Status: map[string]appv1.CronJobStatus{}, Seen: map[string]string{}}
	for id, cj := range a.jobs {
		st := *cj.status.DeepCopy()
		st.Running = 0
		fa.Status[id] = st
	}
	for id, t := range a.seen {
		fa.Seen[id] = t
	}
	s.file.Apps[key.String()] = fa
	s.writeLocked()
}

func (s *Scheduler) writeLocked() {
	b, err := json.Marshal(s.file)
	if err == nil {
		tmp := s.path + ".tmp"
		if err = os.MkdirAll(filepath.Dir(s.path), 0o700); err == nil {
			if err = os.WriteFile(tmp, b, 0o600); err == nil {
				err = os.Rename(tmp, s.path)
			}
		}
	}
	if err != nil {
		s.log.Warn("cron state not saved", "err", err)
	}
}

// jobIDs lists an app's scheduled job ids, sorted (tests).
func (s *Scheduler) jobIDs(key types.NamespacedName) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	if a := s.apps[key]; a != nil {
		for id := range a.jobs {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// cronStatusForTest syncs d's cron jobs only.
func (r *Runtime) cronStatusForTest(d runtime.Desired) runtime.Status {
	return runtime.Status{Cron: r.cron.Sync(d)}
}
