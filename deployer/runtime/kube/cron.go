package kube

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// Cron jobs on a cluster are Kubernetes CronJobs, one per job of the app: the
// kube-controller-manager's CronJob controller does the scheduling, the
// concurrency policy and the history; Sync only writes them and reads their Jobs
// back into runtime.CronStatus.
const (
	// LabelCronJob names the cron job (its id) on a CronJob, its Jobs and their
	// pods.
	LabelCronJob = "app.bex.co/cron-job"
	// AnnotationCronRunSeen on a CronJob is the last cron:run token a Job was
	// made for, so that a token starts one run only, whatever the controller
	// has pruned of the history since.
	AnnotationCronRunSeen = "app.bex.co/cron-run-seen"
)

// Bounds of a CronJob.
const (
	// cronHistory is how many finished Jobs of each outcome the controller keeps,
	// with their pods: enough to tell appv1.CronFailingThreshold failures in a
	// row, and to read the last runs' logs.
	cronHistory = appv1.CronFailingThreshold
	// cronStartingDeadline is how late a run may still start (the controller
	// was down, the node full). Without it a controller that comes back after a
	// long outage counts every missed time, and refuses to schedule past 100.
	cronStartingDeadline = 300
	// maxCronJobName is the longest CronJob name: the controller names its Jobs
	// <cronjob>-<minutes since the epoch>, and a Job's name is at most 63
	// characters, so the API server refuses longer CronJob names.
	maxCronJobName = 52
)

// CronJobName is the name of the CronJob of job id of app: "<app>-<id>", or a
// shortened app name and a hash of both when that is too long. Job ids have no
// "-", so two apps' names never meet.
func CronJobName(app, id string) string {
	name := app + "-" + id
	if len(name) <= maxCronJobName {
		return name
	}
	sum := sha256.Sum256([]byte(app + "\x00" + id))
	h := hex.EncodeToString(sum[:5])
	keep := maxCronJobName - 1 - len(h)
	return strings.TrimRight(name[:keep], "-.") + "-" + h
}

// cronRunJobName is the name of the Job a cron:run token starts: the same
// token gives the same name, so a Sync that runs twice makes one Job.
func cronRunJobName(cronJob, token string) string {
	sum := sha256.Sum256([]byte(token))
	return cronJob + "-run" + hex.EncodeToString(sum[:3])
}

// CheckCronSchedule tells whether the API server takes schedule for a CronJob:
// robfig/cron's standard parser (5 fields and the @ forms), and no TZ= or
// CRON_TZ= in it (the zone is the CronJob's timeZone).
func CheckCronSchedule(schedule string) error {
	if strings.Contains(schedule, "TZ") {
		return fmt.Errorf("schedule %q: the zone is the app's TZ config var, not part of the schedule", schedule)
	}
	if _, err := cron.ParseStandard(schedule); err != nil {
		return fmt.Errorf("schedule %q: %w", schedule, err)
	}
	return nil
}

// cronTimeZone is the CronJob timeZone of an app with config var TZ tz: nil for
// none (UTC in the controller), an error for a zone Go does not know (the API
// server would refuse it).
func cronTimeZone(tz string) (*string, error) {
	if tz == "" || tz == "UTC" {
		return nil, nil
	}
	if tz == "Local" {
		return nil, fmt.Errorf("TZ %q: name a zone (Europe/Paris, UTC)", tz)
	}
	if _, err := time.LoadLocation(tz); err != nil {
		return nil, fmt.Errorf("TZ %q: %w", tz, err)
	}
	return &tz, nil
}

// cronJob is the apply configuration of job j of d: a Job of one pod (never
// restarted, no retry) that runs `sh -c COMMAND` in d's image with d's config
// vars and every volume, confined as the app's instances are. suspend stops the scheduling
// (runs going finish). seen is the AnnotationCronRunSeen to keep ("": none).
func cronJob(cfg Config, d runtime.Desired, j appv1.CronJob, tz *string, suspend bool, seen string) *batchv1ac.CronJobApplyConfiguration {
	app := d.App
	labels := map[string]string{LabelApp: app.Name, LabelCronJob: j.ID}
	podLabels := map[string]string{
		LabelApp:     app.Name,
		LabelCronJob: j.ID,
		LabelProcess: "cron." + j.ID,
		LabelRelease: strconv.FormatInt(d.Release, 10),
	}
	c := oneOffContainer(cfg, d.Image, escapeArgv([]string{"sh", "-c", j.Command}), d.Env, nil)
	withVolumeMounts(c, d.Volumes) // before podSpec, which copies the container
	pod := podSpec(cfg, c).
		WithRestartPolicy(corev1.RestartPolicyNever).
		WithTerminationGracePeriodSeconds(cfg.TerminationGracePeriodSeconds)
	withOneOffClaims(pod, app.Name, d.Volumes)
	cj := batchv1ac.CronJob(CronJobName(app.Name, j.ID), app.Namespace).
		WithLabels(labels).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(batchv1ac.CronJobSpec().
			WithSchedule(j.Schedule).
			WithConcurrencyPolicy(batchv1.ConcurrencyPolicy(j.Policy())).
			WithSuspend(suspend).
			WithStartingDeadlineSeconds(cronStartingDeadline).
			WithSuccessfulJobsHistoryLimit(cronHistory).
			WithFailedJobsHistoryLimit(cronHistory).
			WithJobTemplate(batchv1ac.JobTemplateSpec().
				WithLabels(labels).
				WithSpec(batchv1ac.JobSpec().
					WithBackoffLimit(0).
					WithTemplate(corev1ac.PodTemplateSpec().WithLabels(podLabels).WithSpec(pod)))))
	if tz != nil {
		cj.Spec.WithTimeZone(*tz)
	}
	if seen != "" {
		cj.WithAnnotations(map[string]string{AnnotationCronRunSeen: seen})
	}
	return cj
}

// syncCron applies one CronJob per job of d (suspended while the app is, or
// while its TZ is not a zone), deletes those of jobs d no longer has, starts a
// Job for each cron:run token not seen before, and reports the jobs' runs.
func (r *Runtime) syncCron(ctx context.Context, d runtime.Desired) ([]runtime.CronStatus, error) {
	key := d.Key()
	log := logf.FromContext(ctx)
	var list batchv1.CronJobList
	if err := r.c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name}); err != nil {
		return nil, fmt.Errorf("app %s: list cronjobs: %w", key, err)
	}
	existing := map[string]*batchv1.CronJob{}
	for i := range list.Items {
		if id := list.Items[i].Labels[LabelCronJob]; id != "" {
			existing[id] = &list.Items[i]
		}
	}
	tz, tzErr := cronTimeZone(appv1.CronZone(d.Env))
	if tzErr != nil && len(d.Cron) > 0 {
		log.Info("cron jobs not scheduled", "app", key.String(), "err", tzErr.Error())
	}
	want := map[string]bool{}
	for _, j := range d.Cron {
		if err := CheckCronSchedule(j.Schedule); err != nil {
			// The App's schema cannot check a schedule; the gitserver does, so
			// this is an App written by hand. The other jobs still run.
			log.Info("cron job not scheduled", "app", key.String(), "job", j.ID, "err", err.Error())
			continue
		}
		want[j.ID] = true
		var seen string
		if old := existing[j.ID]; old != nil {
			seen = old.Annotations[AnnotationCronRunSeen]
		}
		ac := cronJob(r.cfg, d, j, tz, d.Suspended || tzErr != nil, seen)
		if err := r.c.Apply(ctx, ac, client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("app %s: apply cronjob %s: %w", key, *ac.Name, err)
		}
		token := d.CronRuns[j.ID]
		if token == "" || token == seen || d.Suspended {
			continue
		}
		running, err := r.runningCronRuns(ctx, key)
		if err != nil {
			return nil, err
		}
		if running >= maxCronRunsPerApp {
			// As on one machine: a member's cron:run in a loop of a job that
			// never ends would otherwise start pods without end. The token is
			// recorded all the same, so it is refused once, not retried.
			log.Info("cron:run refused: the app has its most runs going", "app", key.String(), "job", j.ID, "max", maxCronRunsPerApp)
		} else if err := r.startCronRun(ctx, ac, token); err != nil {
			return nil, fmt.Errorf("app %s: cron:run %s: %w", key, j.ID, err)
		}
		// Recorded only once the Job exists: a Sync that fails in between makes
		// the same Job again (same name), which is no second run.
		ac.WithAnnotations(map[string]string{AnnotationCronRunSeen: token})
		if err := r.c.Apply(ctx, ac, client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("app %s: apply cronjob %s: %w", key, *ac.Name, err)
		}
	}
	for id, cj := range existing {
		if want[id] {
			continue
		}
		if err := r.delete(ctx, cj); err != nil {
			return nil, fmt.Errorf("app %s: delete cronjob %s of removed job %s: %w", key, cj.Name, id, err)
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	return r.cronStatus(ctx, d)
}

// maxCronRunsPerApp is how many of an app's cron runs (of any job) may be going
// when a cron:run starts another: at that many, it is refused, as the local
// runtime bounds its runs.
const maxCronRunsPerApp = 10

// runningCronRuns counts the app's cron Jobs that have not finished.
func (r *Runtime) runningCronRuns(ctx context.Context, key client.ObjectKey) (int, error) {
	var jobs batchv1.JobList
	if err := r.c.List(ctx, &jobs, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name},
		client.HasLabels{LabelCronJob}); err != nil {
		return 0, fmt.Errorf("app %s: list jobs: %w", key, err)
	}
	n := 0
	for i := range jobs.Items {
		if _, finished := jobExit(&jobs.Items[i], nil); !finished && jobs.Items[i].DeletionTimestamp == nil {
			n++
		}
	}
	return n, nil
}

// startCronRun creates one Job from the CronJob's template now, owned by the
// CronJob as `kubectl create job --from=cronjob/NAME` makes it, so that the
// controller counts it in the job's history and prunes it with the rest.
func (r *Runtime) startCronRun(ctx context.Context, ac *batchv1ac.CronJobApplyConfiguration, token string) error {
	cj := &batchv1.CronJob{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: *ac.Namespace, Name: *ac.Name}, cj); err != nil {
		return err
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:        cronRunJobName(cj.Name, token),
			Namespace:   cj.Namespace,
			Labels:      cj.Spec.JobTemplate.Labels,
			Annotations: map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj,
				batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
	err := r.c.Create(ctx, job, client.FieldOwner(r.cfg.FieldManager))
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// cronStatus reads the app's cron Jobs and their pods into one CronStatus per
// job that has run: the last run's start, the exit status of the newest
// finished run (its pod's, or from the Job's outcome once the pod is gone), the
// runs going, and the failures in a row. Skipped runs are not counted: the
// controller skips a Forbid run without a trace but an event.
func (r *Runtime) cronStatus(ctx context.Context, d runtime.Desired) ([]runtime.CronStatus, error) {
	key := d.Key()
	var jobs batchv1.JobList
	if err := r.c.List(ctx, &jobs, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name},
		client.HasLabels{LabelCronJob}); err != nil {
		return nil, fmt.Errorf("app %s: list jobs: %w", key, err)
	}
	var pods corev1.PodList
	if err := r.c.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name},
		client.HasLabels{LabelCronJob}); err != nil {
		return nil, fmt.Errorf("app %s: list pods: %w", key, err)
	}
	return cronStatusOf(d.Cron, jobs.Items, pods.Items), nil
}

// cronStatusOf is cronStatus's reading, without the API: a pure function for
// tests.
func cronStatusOf(cronJobs []appv1.CronJob, jobs []batchv1.Job, pods []corev1.Pod) []runtime.CronStatus {
	podOf := map[string]*corev1.Pod{}
	for i := range pods {
		if name := pods[i].Labels[batchv1.JobNameLabel]; name != "" {
			if prev := podOf[name]; prev == nil || pods[i].CreationTimestamp.After(prev.CreationTimestamp.Time) {
				podOf[name] = &pods[i]
			}
		}
	}
	byID := map[string][]batchv1.Job{}
	for _, j := range jobs {
		if j.DeletionTimestamp == nil {
			byID[j.Labels[LabelCronJob]] = append(byID[j.Labels[LabelCronJob]], j)
		}
	}
	var out []runtime.CronStatus
	for _, cj := range cronJobs {
		runs := byID[cj.ID]
		if len(runs) == 0 {
			continue
		}
		// Newest first.
		slices.SortFunc(runs, func(a, b batchv1.Job) int {
			return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), strings.Compare(b.Name, a.Name))
		})
		st := runtime.CronStatus{ID: cj.ID}
		t := runs[0].CreationTimestamp
		if runs[0].Status.StartTime != nil {
			t = *runs[0].Status.StartTime
		}
		st.LastRun = &metav1.Time{Time: t.Truncate(time.Second)}
		counting := true
		for _, j := range runs {
			exit, finished := jobExit(&j, podOf[j.Name])
			if !finished {
				st.Running++
				continue
			}
			if st.LastExitCode == nil {
				code := int32(exit)
				st.LastExitCode = &code
			}
			if counting {
				if exit != 0 {
					st.ConsecutiveFailures++
				} else {
					counting = false
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// jobExit is the exit status of a cron Job's run, finished false while it runs.
// Its pod tells the status; a pod already gone leaves the Job's outcome: 0 for
// Complete, 1 for Failed (137 past its deadline).
func jobExit(j *batchv1.Job, pod *corev1.Pod) (exit int, finished bool) {
	var done, failed bool
	var reason string
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			done = true
		case batchv1.JobFailed:
			done, failed, reason = true, true, c.Reason
		}
	}
	if pod != nil {
		if code, ok := exitOf(pod); ok {
			return code, true
		}
	}
	switch {
	case !done:
		return 0, false
	case !failed:
		return 0, true
	case reason == batchv1.JobReasonDeadlineExceeded:
		return 137, true
	default:
		return 1, true
	}
}

// deleteCronJobs deletes the app's CronJobs; their Jobs and pods follow
// (background propagation).
func (r *Runtime) deleteCronJobs(ctx context.Context, app client.ObjectKey) error {
	err := r.c.DeleteAllOf(ctx, &batchv1.CronJob{}, client.InNamespace(app.Namespace),
		client.MatchingLabels{LabelApp: app.Name}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("app %s: delete cronjobs: %w", app, err)
	}
	return nil
}
