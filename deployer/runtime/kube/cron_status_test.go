package kube

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

func cronRun(id, name string, at time.Time, cond batchv1.JobConditionType, reason string) batchv1.Job {
	j := batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at),
		Labels: map[string]string{LabelCronJob: id}}}
	if cond != "" {
		j.Status.Conditions = []batchv1.JobCondition{{Type: cond, Status: corev1.ConditionTrue, Reason: reason}}
	}
	return j
}

func cronPod(job string, exit int32) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job + "-x", Labels: map[string]string{batchv1.JobNameLabel: job}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: OneOffContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit}}}}}}
}

// TestCronStatusOf: the newest run gives lastRun; the newest finished one the
// exit status, from its pod, or from the Job's outcome once the pod is gone;
// failures in a row count back to the last success.
func TestCronStatusOf(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	jobs := []appv1.CronJob{{ID: "aaa"}, {ID: "bbb"}, {ID: "ccc"}, {ID: "ddd"}}
	runs := []batchv1.Job{
		// aaa: ok, then two failures (one whose pod is gone), then one running.
		cronRun("aaa", "a1", t0, batchv1.JobComplete, ""),
		cronRun("aaa", "a2", t0.Add(time.Minute), batchv1.JobFailed, "BackoffLimitExceeded"),
		cronRun("aaa", "a3", t0.Add(2*time.Minute), batchv1.JobFailed, "BackoffLimitExceeded"),
		cronRun("aaa", "a4", t0.Add(3*time.Minute), "", ""),
		// bbb: past its deadline, pod gone.
		cronRun("bbb", "b1", t0, batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded),
		// ccc: the pod says it ended before the Job's condition came.
		cronRun("ccc", "c1", t0, "", ""),
	}
	pods := []corev1.Pod{cronPod("a1", 0), cronPod("a3", 2), cronPod("c1", 0)}
	got := cronStatusOf(jobs, runs, pods)
	if len(got) != 3 {
		t.Fatalf("%d statuses, want 3 (ddd never ran): %+v", len(got), got)
	}
	a, b, c := got[0], got[1], got[2]
	if a.ID != "aaa" || !a.LastRun.Time.Equal(t0.Add(3*time.Minute)) || a.Running != 1 || a.LastExitCode == nil || *a.LastExitCode != 2 || a.ConsecutiveFailures != 2 {
		t.Errorf("aaa %+v (exit %v)", a, a.LastExitCode)
	}
	if b.ID != "bbb" || b.LastExitCode == nil || *b.LastExitCode != 137 || b.ConsecutiveFailures != 1 {
		t.Errorf("bbb %+v", b)
	}
	if c.ID != "ccc" || c.Running != 0 || c.LastExitCode == nil || *c.LastExitCode != 0 || c.ConsecutiveFailures != 0 {
		t.Errorf("ccc %+v", c)
	}
}
