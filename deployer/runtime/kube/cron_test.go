package kube_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
)

var web = map[string]appv1.ProcessSpec{"web": {Replicas: 1}}

func (f *fixture) cronJob(id string) *batchv1.CronJob {
	f.t.Helper()
	cj := &batchv1.CronJob{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: kube.CronJobName("hello", id)}, cj); err != nil {
		f.t.Fatalf("get cronjob of %s: %v", id, err)
	}
	return cj
}

func (f *fixture) cronRuns(id string) []batchv1.Job {
	f.t.Helper()
	var jobs batchv1.JobList
	if err := f.c.List(f.ctx, &jobs, client.InNamespace(f.ns), client.MatchingLabels{kube.LabelCronJob: id}); err != nil {
		f.t.Fatal(err)
	}
	return jobs.Items
}

// TestCronJobsAreCronJobs: each job of the app is a CronJob that runs its
// command in the release's image with its config, confined as the instances
// are, on its schedule in the app's TZ, with its concurrency policy; a job
// removed from the app is deleted; a suspended app's are suspended.
func TestCronJobsAreCronJobs(t *testing.T) {
	f := setup(t)
	d := f.desired(3, imageA, web)
	d.Env = []appv1.EnvVar{{Name: "TZ", Value: "Europe/Paris"}, {Name: "GREETING", Value: "hi $HOME"}}
	// A volume of web only: a cron run, as every one-off, mounts it all the same.
	d.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("1Gi"), Processes: []string{"web"}}}
	d.Cron = []appv1.CronJob{
		{ID: "aaa", Command: "echo $GREETING; exit 2", Schedule: "*/5 * * * *"},
		{ID: "bbb", Command: "./nightly", Schedule: "@daily", ConcurrencyPolicy: appv1.CronAllow},
	}
	f.sync(d)

	cj := f.cronJob("aaa")
	s := cj.Spec
	if s.Schedule != "*/5 * * * *" || s.TimeZone == nil || *s.TimeZone != "Europe/Paris" ||
		s.ConcurrencyPolicy != batchv1.ForbidConcurrent || s.Suspend == nil || *s.Suspend {
		t.Errorf("cronjob spec: schedule %q, tz %v, policy %s, suspend %v", s.Schedule, s.TimeZone, s.ConcurrencyPolicy, s.Suspend)
	}
	if s.StartingDeadlineSeconds == nil || *s.SuccessfulJobsHistoryLimit < appv1.CronFailingThreshold || *s.FailedJobsHistoryLimit < appv1.CronFailingThreshold {
		t.Errorf("cronjob bounds: deadline %v, history %v/%v", s.StartingDeadlineSeconds, s.SuccessfulJobsHistoryLimit, s.FailedJobsHistoryLimit)
	}
	if refs := cj.OwnerReferences; len(refs) != 1 || refs[0].UID != f.app.UID || refs[0].Kind != "App" {
		t.Errorf("owner references %+v", refs)
	}
	js := s.JobTemplate.Spec
	if js.BackoffLimit == nil || *js.BackoffLimit != 0 {
		t.Errorf("backoffLimit %v: a failed run is reported, not retried", js.BackoffLimit)
	}
	pod := js.Template.Spec
	tl := js.Template.Labels
	if tl[kube.LabelApp] != "hello" || tl[kube.LabelProcess] != "cron.aaa" || tl[kube.LabelRelease] != "3" || tl[kube.LabelCronJob] != "aaa" {
		t.Errorf("pod labels %v: logs --process cron.aaa selects by them", tl)
	}
	if pod.RestartPolicy != corev1.RestartPolicyNever || pod.HostUsers == nil || *pod.HostUsers ||
		pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("pod spec: restart %s, hostUsers %v, token %v", pod.RestartPolicy, pod.HostUsers, pod.AutomountServiceAccountToken)
	}
	c := pod.Containers[0]
	if c.Image != imageA || !slices.Equal(c.Command, []string{"sh", "-c", "echo $$GREETING; exit 2"}) {
		t.Errorf("container image %s command %q (the command is literal: $ escaped from Kubernetes' expansion)", c.Image, c.Command)
	}
	if env := envByName(c.Env); env["GREETING"].Value != "hi $$HOME" || env["PORT"].Value == "" {
		t.Errorf("env %v", c.Env)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || slices.Contains(sc.Capabilities.Add, "NET_RAW") {
		t.Errorf("security context %+v", sc)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/data" || len(pod.Volumes) != 1 ||
		pod.Volumes[0].PersistentVolumeClaim == nil || pod.Volumes[0].PersistentVolumeClaim.ClaimName != kube.VolumeClaimName("hello", "data") {
		t.Errorf("volumes of a cron run: mounts %+v, pod volumes %+v", c.VolumeMounts, pod.Volumes)
	}
	if c.Resources.Limits.Memory().IsZero() {
		t.Errorf("no memory limit: %v", c.Resources)
	}
	if p := f.cronJob("bbb").Spec.ConcurrencyPolicy; p != batchv1.AllowConcurrent {
		t.Errorf("bbb policy %s", p)
	}

	// Unchanged: no write.
	rv := f.cronJob("aaa").ResourceVersion
	f.sync(d)
	if got := f.cronJob("aaa").ResourceVersion; got != rv {
		t.Errorf("a Sync without change wrote the CronJob (%s → %s)", rv, got)
	}

	// A job removed from app.json goes; suspended, the others stop scheduling.
	d.Cron = d.Cron[1:]
	d.Suspended = true
	f.sync(d)
	if !f.gone(&batchv1.CronJob{}, kube.CronJobName("hello", "aaa")) {
		t.Error("the CronJob of a removed job is still there")
	}
	if s := f.cronJob("bbb").Spec.Suspend; s == nil || !*s {
		t.Error("a suspended app's CronJob is not suspended")
	}
	d.Suspended = false
	f.sync(d)
	if s := f.cronJob("bbb").Spec.Suspend; s == nil || *s {
		t.Error("a resumed app's CronJob is still suspended")
	}

	if err := f.rt.Delete(f.ctx, d.Key()); err != nil {
		t.Fatal(err)
	}
	if !f.gone(&batchv1.CronJob{}, kube.CronJobName("hello", "bbb")) {
		t.Error("Delete left a CronJob")
	}
}

// TestCronJobsTheAPIServerWouldRefuse: a TZ that is no zone suspends the jobs
// and a schedule that is not standard leaves that job out; neither fails the
// app's Sync (its processes still roll out).
func TestCronJobsTheAPIServerWouldRefuse(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, web)
	d.Cron = []appv1.CronJob{
		{ID: "good", Command: "true", Schedule: "@hourly"},
		{ID: "bad", Command: "true", Schedule: "CRON_TZ=Asia/Tokyo 0 1 * * *"},
	}
	d.Env = []appv1.EnvVar{{Name: "TZ", Value: "Mars/Olympus"}}
	f.sync(d)
	if s := f.cronJob("good").Spec.Suspend; s == nil || !*s {
		t.Error("a job under an unknown TZ is scheduled")
	}
	if !f.gone(&batchv1.CronJob{}, kube.CronJobName("hello", "bad")) {
		t.Error("a job whose schedule names a zone was written")
	}
	d.Env = nil
	f.sync(d)
	if cj := f.cronJob("good"); *cj.Spec.Suspend || cj.Spec.TimeZone != nil {
		t.Errorf("without TZ: suspend %v, timeZone %v", *cj.Spec.Suspend, cj.Spec.TimeZone)
	}
}

// TestCronRunStartsOneJob: a cron:run token starts one Job from the CronJob's
// template now, owned by the CronJob; the same token again starts nothing, a
// new one starts another.
func TestCronRunStartsOneJob(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, web)
	d.Cron = []appv1.CronJob{{ID: "aaa", Command: "echo tick", Schedule: "@daily"}}
	f.sync(d)
	if n := len(f.cronRuns("aaa")); n != 0 {
		t.Fatalf("%d runs before any cron:run", n)
	}
	d.CronRuns = map[string]string{"aaa": "2026-12-02T03:00:00Z", "nope": "x"}
	f.sync(d)
	f.sync(d)
	runs := f.cronRuns("aaa")
	if len(runs) != 1 {
		t.Fatalf("%d runs after one cron:run synced twice, want 1", len(runs))
	}
	job := runs[0]
	cj := f.cronJob("aaa")
	if refs := job.OwnerReferences; len(refs) != 1 || refs[0].UID != cj.UID || refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("the run's owner %+v: the CronJob's controller prunes it with the history", refs)
	}
	if c := job.Spec.Template.Spec.Containers[0]; !slices.Equal(c.Command, []string{"sh", "-c", "echo tick"}) || c.Image != imageA {
		t.Errorf("run container %s %q", c.Image, c.Command)
	}
	if cj.Annotations[kube.AnnotationCronRunSeen] != d.CronRuns["aaa"] {
		t.Errorf("seen annotation %q", cj.Annotations[kube.AnnotationCronRunSeen])
	}
	d.CronRuns = map[string]string{"aaa": "2026-12-02T03:00:05Z"}
	f.sync(d)
	if n := len(f.cronRuns("aaa")); n != 2 {
		t.Errorf("%d runs after a second cron:run, want 2", n)
	}
	// The history is reported from the Jobs: two runs going.
	st := f.sync(d)
	if len(st.Cron) != 1 || st.Cron[0].ID != "aaa" || st.Cron[0].Running != 2 || st.Cron[0].LastRun == nil {
		t.Errorf("cron status %+v", st.Cron)
	}
}

// TestCronRunsAreBounded: cron:run in a loop (a member's, of a job that never
// ends) starts at most 10 runs going at once, as on one machine.
func TestCronRunsAreBounded(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, web)
	d.Cron = []appv1.CronJob{{ID: "aaa", Command: "sleep 86400", Schedule: "@yearly", ConcurrencyPolicy: appv1.CronAllow}}
	for i := range 12 {
		d.CronRuns = map[string]string{"aaa": "token-" + strconv.Itoa(i)}
		f.sync(d)
	}
	// No kubelet here: every Job stays unfinished.
	if n := len(f.cronRuns("aaa")); n != 10 {
		t.Errorf("%d runs after 12 cron:runs with none finished, want 10", n)
	}
}

// TestLongNamesFitTheAPIServer: the longest app name with the longest job id
// makes a CronJob and a cron:run Job the API server takes.
func TestLongNamesFitTheAPIServer(t *testing.T) {
	f := setup(t)
	long := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("a", 40), Namespace: f.ns}}
	if err := f.c.Create(f.ctx, long); err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("b", 16)
	d := runtime.Desired{App: long, Release: 1, Image: imageA, Processes: web,
		Cron: []appv1.CronJob{{ID: id, Command: "true", Schedule: "@daily"}}, CronRuns: map[string]string{id: "t"}}
	if _, err := f.rt.Sync(f.ctx, d); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	name := kube.CronJobName(long.Name, id)
	if len(name) > 52 || kube.CronJobName(long.Name, id) != name || kube.CronJobName(long.Name, "c") == name {
		t.Errorf("name %q (%d)", name, len(name))
	}
	if n := len(f.cronRuns(id)); n != 1 {
		t.Errorf("%d runs", n)
	}
}

func TestCheckCronSchedule(t *testing.T) {
	for _, s := range []string{"* * * * *", "0 3 * * 1-5", "@daily", "@every 90s", "@hourly"} {
		if err := kube.CheckCronSchedule(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "* * * *", "61 * * * *", "TZ=UTC * * * * *", "CRON_TZ=UTC 0 0 * * *", "@never"} {
		if err := kube.CheckCronSchedule(s); err == nil {
			t.Errorf("%q taken", s)
		}
	}
}
