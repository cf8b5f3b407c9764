package backend_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

func TestCronListAndRun(t *testing.T) {
	a := deployed(app("shop", "bob"))
	a.Spec.Env = []appv1.EnvVar{{Name: "TZ", Value: "Asia/Tokyo"}}
	a.Spec.Cron = []appv1.CronJob{
		{ID: "aaa", Command: "exit 2", Schedule: "0 12 * * *"},
		{ID: "bbb", Command: "true", Schedule: "@every 2s", ConcurrencyPolicy: appv1.CronAllow},
		{ID: "ccc", Command: "x", Schedule: "not a schedule"},
	}
	code := int32(2)
	a.Status.Cron = []appv1.CronJobStatus{{ID: "aaa", LastRun: &metav1.Time{Time: time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)}, LastExitCode: &code, ConsecutiveFailures: 3, Skipped: 1}}
	f := newFixture(t, a, app("other"))
	ctx := context.Background()
	jobs, err := f.b.Cron(ctx, member, "shop")
	if err != nil || len(jobs) != 3 {
		t.Fatalf("Cron = %+v, %v", jobs, err)
	}
	j := jobs[0]
	if j.ID != "aaa" || j.LastExitCode == nil || *j.LastExitCode != 2 || !j.Failing || j.ConcurrencyPolicy != "Forbid" || j.NextRun == nil {
		t.Fatalf("aaa: %+v", j)
	}
	// 12:00 in Tokyo is 03:00 UTC.
	if h := j.NextRun.UTC().Hour(); h != 3 || j.NextRun.Sub(time.Now()) > 24*time.Hour {
		t.Errorf("aaa next run %s, want the next 03:00 UTC", j.NextRun)
	}
	if jobs[1].LastRun != nil || jobs[1].LastExitCode != nil || jobs[1].Failing || jobs[1].ConcurrencyPolicy != "Allow" {
		t.Errorf("bbb: %+v", jobs[1])
	}
	if jobs[2].NextRun != nil || !strings.Contains(jobs[2].Error, "not a schedule") {
		t.Errorf("ccc: %+v", jobs[2])
	}
	// The JSON names are a contract: the six first, in order, nulls when none.
	b, _ := json.Marshal(jobs[1])
	if !strings.HasPrefix(string(b), `{"id":"bbb","command":"true","schedule":"@every 2s","lastRun":null,"lastExitCode":null,"nextRun":"`) {
		t.Errorf("json %s", b)
	}
	info, err := f.b.App(ctx, member, "shop")
	if err != nil || len(info.Cron) != 3 {
		t.Fatalf("App: cron %+v, %v", info, err)
	}

	wantKind(t, "unknown id", f.b.CronRun(ctx, member, "shop", "zzz"), backend.Invalid, `no cron job "zzz": its jobs are aaa, bbb, ccc`)
	wantKind(t, "no jobs", f.b.CronRun(ctx, admin, "other", "zzz"), backend.Invalid, "has no cron jobs")
	_, err = f.b.Cron(ctx, guest, "shop")
	if err == nil {
		t.Errorf("a guest listed the cron jobs")
	}
	if err := f.b.CronRun(ctx, guest, "shop", "aaa"); err == nil {
		t.Errorf("a guest ran a cron job")
	}
	before := time.Now().UTC()
	if err := f.b.CronRun(ctx, member, "shop", "bbb"); err != nil {
		t.Fatal(err)
	}
	got := &appv1.App{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop"}, got); err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339Nano, got.CronRuns()["bbb"])
	if err != nil || at.Before(before.Add(-time.Second)) {
		t.Fatalf("annotation %v: %v", got.Annotations, err)
	}
}
