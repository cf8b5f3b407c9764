package local

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// fakeClock moves only when the test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	c  chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) At(t time.Time) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !t.After(c.now) {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{t, ch})
	return ch
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.c <- c.now
		} else {
			keep = append(keep, w)
		}
	}
	c.waiters = keep
}

// fakeOneOffs records the runs started; the test ends them.
type fakeOneOffs struct {
	mu      sync.Mutex
	started []runtime.OneOff
	done    map[string]func(int)
	ctxs    map[string]context.Context
}

func (f *fakeOneOffs) Run(context.Context, runtime.OneOff) (int, error) { panic("not used") }

func (f *fakeOneOffs) Start(ctx context.Context, o runtime.OneOff, done func(int)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, o)
	f.done[o.ID], f.ctxs[o.ID] = done, ctx
	return nil
}

func (f *fakeOneOffs) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

func (f *fakeOneOffs) finish(i, exit int) {
	f.mu.Lock()
	o := f.started[i]
	done := f.done[o.ID]
	f.mu.Unlock()
	done(exit)
}

func cronDesired(jobs ...appv1.CronJob) runtime.Desired {
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop", UID: "u1"}}
	return runtime.Desired{App: app, Release: 3, Image: "bex.local/shop@sha256:1", Env: []appv1.EnvVar{{Name: "A", Value: "b"}}, Cron: jobs}
}

func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, what, f)
}

func TestSchedulerRunsSkipsAndRemembers(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC)}
	oo := &fakeOneOffs{done: map[string]func(int){}, ctxs: map[string]context.Context{}}
	path := filepath.Join(t.TempDir(), "cron.json")
	s, err := NewScheduler(oo, path, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := appv1.CronJob{ID: "j1", Command: "echo tick; exit 2", Schedule: "* * * * *"}
	d := cronDesired(job)
	if st := s.Sync(d); len(st) != 0 {
		t.Fatalf("status before any run: %+v", st)
	}
	// Nothing before the minute.
	clock.advance(29 * time.Second)
	time.Sleep(20 * time.Millisecond) // give a wrong scheduler the chance to start early
	if n := oo.count(); n != 0 {
		t.Fatalf("%d runs before the minute", n)
	}
	clock.advance(time.Second) // 10:01:00
	waitFor(t, "the first run", func() error {
		if oo.count() != 1 {
			return fmt.Errorf("%d runs", oo.count())
		}
		return nil
	})
	o := oo.started[0]
	if o.Process != "cron.j1" || o.Image != d.Image || o.Release != 3 || len(o.Command) != 3 || o.Command[2] != job.Command || o.Env[0].Name != "A" {
		t.Fatalf("one-off %+v", o)
	}
	// The next minute comes while it runs: Forbid skips it.
	clock.advance(time.Minute)
	waitFor(t, "a skipped run", func() error {
		st := s.Status(d.Key())
		if len(st) != 1 || st[0].Skipped != 1 || st[0].Running != 1 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	oo.finish(0, 2)
	st := s.Status(d.Key())
	if st[0].LastExitCode == nil || *st[0].LastExitCode != 2 || st[0].ConsecutiveFailures != 1 || st[0].Running != 0 ||
		!st[0].LastRun.Time.Equal(time.Date(2026, 12, 1, 10, 1, 0, 0, time.UTC)) {
		t.Fatalf("status after exit 2: %+v", st[0])
	}
	// cron:run: a new token starts one now; the same token again does not.
	d.CronRuns = map[string]string{"j1": "t1"}
	s.Sync(d)
	waitFor(t, "the cron:run", func() error {
		if oo.count() != 2 {
			return fmt.Errorf("%d runs", oo.count())
		}
		return nil
	})
	oo.finish(1, 0)
	if st := s.Status(d.Key()); st[0].ConsecutiveFailures != 0 || *st[0].LastExitCode != 0 {
		t.Fatalf("after a success: %+v", st[0])
	}
	s.Sync(d)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart keeps the history and the tokens seen.
	s2, err := NewScheduler(oo, path, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	st = s2.Sync(d)
	if len(st) != 1 || st[0].Skipped != 1 || st[0].LastExitCode == nil || *st[0].LastExitCode != 0 {
		t.Fatalf("status after a restart: %+v", st)
	}
	time.Sleep(20 * time.Millisecond)
	if n := oo.count(); n != 2 {
		t.Fatalf("the seen token ran again after a restart: %d runs", n)
	}
	// Jobs gone from spec stop; Delete forgets the app.
	s2.Sync(cronDesired())
	if ids := s2.jobIDs(d.Key()); len(ids) != 0 {
		t.Fatalf("jobs left %v", ids)
	}
	s2.Delete(d.Key())
	if st := s2.Status(types.NamespacedName{Namespace: "ns", Name: "shop"}); st != nil {
		t.Fatalf("status after Delete %+v", st)
	}
}

func TestSchedulerPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy     appv1.CronConcurrency
		runs       int
		cancelled0 bool
	}{{appv1.CronAllow, 2, false}, {appv1.CronReplace, 2, true}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			clock := &fakeClock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
			oo := &fakeOneOffs{done: map[string]func(int){}, ctxs: map[string]context.Context{}}
			s, err := NewScheduler(oo, filepath.Join(t.TempDir(), "cron.json"), clock, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.Sync(cronDesired(appv1.CronJob{ID: "j", Command: "sleep 9", Schedule: "@every 1s", ConcurrencyPolicy: tc.policy}))
			for i := 1; i <= tc.runs; i++ {
				clock.advance(time.Second)
				waitFor(t, "a run", func() error {
					if oo.count() != i {
						return fmt.Errorf("%d runs", oo.count())
					}
					return nil
				})
			}
			oo.mu.Lock()
			cancelled := oo.ctxs[oo.started[0].ID].Err() != nil
			oo.mu.Unlock()
			if cancelled != tc.cancelled0 {
				t.Fatalf("first run cancelled %v, want %v", cancelled, tc.cancelled0)
			}
		})
	}
}

// A tenant's Allow jobs cannot start containers without end.
func TestSchedulerBoundsRunsPerApp(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	oo := &fakeOneOffs{done: map[string]func(int){}, ctxs: map[string]context.Context{}}
	s, err := NewScheduler(oo, filepath.Join(t.TempDir(), "cron.json"), clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := cronDesired(appv1.CronJob{ID: "j", Command: "sleep 3600", Schedule: "@every 1s", ConcurrencyPolicy: appv1.CronAllow})
	s.Sync(d)
	for i := 0; i < maxCronRunsPerApp+5; i++ {
		clock.advance(time.Second)
		want := min(i+1, maxCronRunsPerApp)
		waitFor(t, "a run or a skip", func() error {
			st := s.Status(d.Key())
			if oo.count() != want || len(st) != 1 || int(st[0].Skipped) != i+1-want {
				return fmt.Errorf("%d runs, status %+v", oo.count(), st)
			}
			return nil
		})
	}
}

func TestParseCronScheduleZones(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s, err := ParseCronSchedule("0 12 * * *", "Asia/Tokyo") // UTC+9: 12:00 JST is 03:00 UTC
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Next(at).UTC(); !got.Equal(time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)) {
		t.Fatalf("next %s", got)
	}
	if _, err := ParseCronSchedule("@daily", ""); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]string{{"61 * * * *", ""}, {"@daily", "Nowhere/Land"}, {"* * * * * *", ""}} {
		if _, err := ParseCronSchedule(bad[0], bad[1]); err == nil {
			t.Errorf("%q in %q parsed", bad[0], bad[1])
		}
	}
	// @every below a second is held to one.
	e, _ := ParseCronSchedule("@every 1ms", "")
	if got := nextRun(e, at); got.Sub(at) != time.Second {
		t.Fatalf("@every 1ms next in %s", got.Sub(at))
	}
}

// With containerd: jobs on a one-second schedule run as one-offs of the
// release, their exit is reported, an overlapping run is skipped, a cron:run
// starts one at once, and the output is the process cron.<id>.
func TestCronJobsRunInContainers(t *testing.T) {
	f := newFixture(t, "cron-real")
	o := f.newOneOffs()
	s, err := NewScheduler(o, filepath.Join(f.cfg.StateDir, "cron.json"), nil, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f.rt.SetScheduler(s)
	d := f.desired(1, f.v1, 0)
	fail := appv1.CronJob{ID: "fail", Command: "echo tick; exit 2", Schedule: "@every 1s"}
	slow := appv1.CronJob{ID: "slow", Command: "sleep 4", Schedule: "@every 1s"}
	once := appv1.CronJob{ID: "once", Command: "echo by hand $GREETING", Schedule: "@yearly"}
	d.Cron = []appv1.CronJob{fail, slow, once}
	d.CronRuns = map[string]string{"once": "2026-12-01T00:00:00Z"}
	started := time.Now()
	byID := func(st runtime.Status) map[string]runtime.CronStatus {
		m := map[string]runtime.CronStatus{}
		for _, c := range st.Cron {
			m[c.ID] = c
		}
		return m
	}
	st := f.syncUntil(d, time.Minute, "exit 2 twice, a skipped slow run, the cron:run done", func(st runtime.Status) bool {
		m := byID(st)
		return m["fail"].LastExitCode != nil && *m["fail"].LastExitCode == 2 && m["fail"].ConsecutiveFailures >= 2 &&
			m["slow"].Skipped >= 1 && m["once"].LastExitCode != nil
	})
	m := byID(st)
	t.Logf("after %s: %+v", time.Since(started).Round(time.Millisecond), st.Cron)
	if *m["once"].LastExitCode != 0 || m["once"].LastRun == nil {
		t.Fatalf("once: %+v", m["once"])
	}
	// A run that could not start shows as exit -1 and a failure.
	if m["slow"].ConsecutiveFailures != 0 || m["once"].ConsecutiveFailures != 0 {
		t.Errorf("a run did not start: %+v", st.Cron)
	}
	if m["slow"].Running != 1 {
		t.Errorf("slow: %+v, want one running", m["slow"])
	}
	var logs syncBuffer
	if err := ReadLogs(context.Background(), f.cfg.StateDir, f.key(), LogOptions{Process: "cron.once"}, &logs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "by hand hello") {
		t.Fatalf("cron.once log %q", logs.String())
	}
	logs = syncBuffer{}
	if err := ReadLogs(context.Background(), f.cfg.StateDir, f.key(), LogOptions{Process: "cron.fail"}, &logs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "tick") {
		t.Fatalf("cron.fail log %q", logs.String())
	}
	// The same token again starts nothing more.
	runs := byID(f.rt.cronStatusForTest(d))["once"].LastRun
	if got := byID(f.rt.cronStatusForTest(d))["once"].LastRun; !got.Equal(runs) {
		t.Fatalf("once ran again")
	}
	// Delete stops the jobs: no container of the app is left.
	if err := f.rt.Delete(context.Background(), f.key()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "no one-off left", func() error {
		if c := f.containers(); len(c) != 0 {
			return fmt.Errorf("containers %v", c)
		}
		return nil
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
