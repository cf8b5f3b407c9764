package backend

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// cronParser reads schedules as the runtimes do: 5 fields and the @ forms.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron lists an app's cron jobs with their last run, its exit and the next run.
func (b *Backend) Cron(ctx context.Context, u *User, name string) ([]CronJobInfo, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	return cronOf(a, time.Now()), nil
}

// CronRun asks for one run of the job id now: an annotation the deployer hands
// its runtime (a new value starts one run, whatever the job's policy).
func (b *Backend) CronRun(ctx context.Context, u *User, name, id string) error {
	if err := u.mayChange("cron:run"); err != nil {
		return err
	}
	key := appv1.CronRunAnnotation + "." + id
	now := time.Now().UTC().Format(time.RFC3339Nano)
	_, err := b.update(ctx, u, name, func(app *appv1.App) error {
		var ids []string
		found := false
		for _, j := range app.Spec.Cron {
			ids = append(ids, j.ID)
			found = found || j.ID == id
		}
		if !found {
			if len(ids) == 0 {
				return Errorf(Invalid, "%s has no cron jobs: app.json's \"cron\" declares them", app.Name)
			}
			return Errorf(Invalid, "%s has no cron job %q: its jobs are %s", app.Name, id, strings.Join(ids, ", "))
		}
		if app.Annotations == nil {
			app.Annotations = map[string]string{}
		}
		app.Annotations[key] = now
		return nil
	})
	if err != nil {
		return err
	}
	b.audit(u, "cron:run", name, "job", id)
	return nil
}

// cronOf is the app's jobs in spec order, with their status and next run after now.
func cronOf(a *appv1.App, now time.Time) []CronJobInfo {
	st := map[string]appv1.CronJobStatus{}
	for _, c := range a.Status.Cron {
		st[c.ID] = c
	}
	tz := appv1.CronZone(a.Spec.Env)
	out := []CronJobInfo{}
	for _, j := range a.Spec.Cron {
		c := st[j.ID]
		in := CronJobInfo{ID: j.ID, Command: j.Command, Schedule: j.Schedule, ConcurrencyPolicy: string(j.Policy()),
			Running: c.Running, ConsecutiveFailures: c.ConsecutiveFailures, Skipped: c.Skipped,
			Failing: c.ConsecutiveFailures >= appv1.CronFailingThreshold}
		if c.LastRun != nil {
			t := c.LastRun.UTC()
			in.LastRun = &t
		}
		if c.LastExitCode != nil {
			e := *c.LastExitCode
			in.LastExitCode = &e
		}
		next, err := nextCronRun(j.Schedule, tz, now)
		switch {
		case err != nil:
			in.Error = err.Error()
		case !next.IsZero():
			in.NextRun = &next
		}
		out = append(out, in)
	}
	return out
}

// nextCronRun is when schedule is due next after now, in the zone tz ("" UTC).
func nextCronRun(schedule, tz string, now time.Time) (time.Time, error) {
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return time.Time{}, fmt.Errorf("TZ %q is not a time zone", tz)
		}
		loc = l
	}
	s, err := cronParser.Parse(schedule)
	if err != nil {
		return time.Time{}, fmt.Errorf("schedule %q: %v", schedule, err)
	}
	if sp, ok := s.(*cron.SpecSchedule); ok {
		sp.Location = loc
	}
	n := s.Next(now)
	if n.IsZero() {
		return n, nil
	}
	return n.UTC(), nil
}
