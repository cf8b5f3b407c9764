package deployer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
)

func i32(n int32) *int32 { return &n }

func TestCronStatusAndCondition(t *testing.T) {
	jobs := []appv1.CronJob{{ID: "aaa", Command: "echo tick; exit 2", Schedule: "@every 1s"}, {ID: "bbb", Command: "true", Schedule: "@daily"}}
	serving := runtime.Status{Serving: 1, RolledOut: true, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1, Ready: 1}}}
	cases := []struct {
		name     string
		jobs     []appv1.CronJob
		got      []runtime.CronStatus
		wantIDs  string
		cond     metav1.ConditionStatus // "" is absent
		inMsg    string
		notInMsg string
	}{
		{name: "no jobs: no status, no condition", got: []runtime.CronStatus{{ID: "aaa"}}, wantIDs: ""},
		{name: "healthy", jobs: jobs, got: []runtime.CronStatus{{ID: "aaa", LastExitCode: i32(0)}}, wantIDs: "aaa", cond: metav1.ConditionTrue},
		{name: "below the threshold", jobs: jobs, got: []runtime.CronStatus{{ID: "aaa", LastExitCode: i32(2), ConsecutiveFailures: appv1.CronFailingThreshold - 1}},
			wantIDs: "aaa", cond: metav1.ConditionTrue},
		{name: "failing job named with its command and exit", jobs: jobs,
			got:     []runtime.CronStatus{{ID: "bbb", LastExitCode: i32(0)}, {ID: "aaa", LastExitCode: i32(2), ConsecutiveFailures: appv1.CronFailingThreshold}},
			wantIDs: "aaa,bbb", cond: metav1.ConditionFalse, inMsg: `cron job aaa ("echo tick; exit 2") failed 3 times in a row, last exit 2`, notInMsg: "bbb"},
		{name: "jobs gone from spec are dropped (bounded)", jobs: jobs[1:],
			got:     []runtime.CronStatus{{ID: "aaa", ConsecutiveFailures: 9}, {ID: "zzz"}, {ID: "bbb"}},
			wantIDs: "bbb", cond: metav1.ConditionTrue},
	}
	r := &AppReconciler{Config: DefaultConfig()}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Generation: 2}, Spec: appv1.AppSpec{Image: "x@sha256:1", Release: 1, Cron: tc.jobs}}
			st := serving
			st.Cron = tc.got
			r.updateStatus(&scope{app: app, synced: true, status: st})
			var ids []string
			for _, c := range app.Status.Cron {
				ids = append(ids, c.ID)
			}
			if got := strings.Join(ids, ","); got != tc.wantIDs {
				t.Errorf("status.cron ids %q, want %q", got, tc.wantIDs)
			}
			c := meta.FindStatusCondition(app.Status.Conditions, appv1.CronHealthyCondition)
			switch {
			case tc.cond == "" && c != nil:
				t.Errorf("condition %+v, want none", c)
			case tc.cond != "" && (c == nil || c.Status != tc.cond):
				t.Errorf("condition %+v, want %s", c, tc.cond)
			case c != nil && (!strings.Contains(c.Message, tc.inMsg) || (tc.notInMsg != "" && strings.Contains(c.Message, tc.notInMsg))):
				t.Errorf("message %q, want %q without %q", c.Message, tc.inMsg, tc.notInMsg)
			case c != nil && c.Status == metav1.ConditionFalse && c.Reason != appv1.CronJobFailingReason:
				t.Errorf("reason %s", c.Reason)
			}
			// A failing job never makes the serving app anything but Running.
			if app.Status.Phase != appv1.AppPhaseRunning || !meta.IsStatusConditionTrue(app.Status.Conditions, appv1.ReadyCondition) {
				t.Errorf("phase %s, conditions %+v", app.Status.Phase, app.Status.Conditions)
			}
		})
	}
}

// The reconciler hands spec.cron and the cron:run annotations to the runtime and
// writes back what it reports, against the real API server.
func TestCronReachesTheRuntimeAndItsStatusTheApp(t *testing.T) {
	e := start(t, DefaultConfig())
	e.create("hello")
	e.rt.set("hello", func(d runtime.Desired) runtime.Status {
		st := runtime.Status{Serving: d.Release, RolledOut: true, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1, Ready: 1}}}
		for _, j := range d.Cron {
			st.Cron = append(st.Cron, runtime.CronStatus{ID: j.ID, LastRun: &metav1.Time{Time: time.Unix(1700000000, 0)}, LastExitCode: i32(7), ConsecutiveFailures: 4})
		}
		st.Cron = append(st.Cron, runtime.CronStatus{ID: "gone"})
		return st
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := e.rec.Record(ctx, "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rec.Wait(ctx, "hello", n, nil); err != nil {
		t.Fatal(err)
	}
	id := appv1.CronJobID("@every 1s", "exit 7")
	app := e.app("hello")
	patch := client.MergeFrom(app.DeepCopy())
	app.Spec.Cron = []appv1.CronJob{{ID: id, Command: "exit 7", Schedule: "@every 1s"}}
	app.Annotations = map[string]string{appv1.CronRunAnnotation + "." + id: "2026-12-01T00:00:00Z"}
	if err := e.c.Patch(ctx, app, patch); err != nil {
		t.Fatal(err)
	}
	e.eventually("status.cron and CronHealthy false, Ready true", func() error {
		app := e.app("hello")
		c := meta.FindStatusCondition(app.Status.Conditions, appv1.CronHealthyCondition)
		if len(app.Status.Cron) != 1 || app.Status.Cron[0].ID != id || app.Status.Cron[0].LastExitCode == nil || *app.Status.Cron[0].LastExitCode != 7 {
			return fmt.Errorf("status.cron %+v", app.Status.Cron)
		}
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != appv1.CronJobFailingReason || !strings.Contains(c.Message, id) {
			return fmt.Errorf("CronHealthy %+v", c)
		}
		if app.Status.Phase != appv1.AppPhaseRunning || !meta.IsStatusConditionTrue(app.Status.Conditions, appv1.ReadyCondition) {
			return fmt.Errorf("phase %s", app.Status.Phase)
		}
		return nil
	})
	e.rt.mu.Lock()
	d := e.rt.synced["hello"]
	e.rt.mu.Unlock()
	if len(d.Cron) != 1 || d.Cron[0].ID != id || d.CronRuns[id] != "2026-12-01T00:00:00Z" {
		t.Fatalf("the runtime was asked for cron %+v runs %v", d.Cron, d.CronRuns)
	}
}
