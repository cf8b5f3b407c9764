package kube

import (
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// dep builds a Deployment in a given state, as the Deployment controller would leave
// it: generation and observedGeneration, spec and status replica counts, the pod
// template's release and an optional Progressing condition.
type depState struct {
	release, serving  int64
	gen, observedGen  int64
	want              int32
	replicas, updated int32
	available         int32
	progressing       corev1.ConditionStatus
	progressingReason string
	progressDeadline  int32
}

func (s depState) build() *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-web", Generation: s.gen},
		Spec: appsv1.DeploymentSpec{
			Replicas: &s.want,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
				Labels: map[string]string{LabelRelease: strconv.FormatInt(s.release, 10)},
			}},
		},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: s.observedGen,
			Replicas:           s.replicas,
			UpdatedReplicas:    s.updated,
			AvailableReplicas:  s.available,
			ReadyReplicas:      s.available,
		},
	}
	if s.serving > 0 {
		d.Labels = map[string]string{LabelServingRelease: strconv.FormatInt(s.serving, 10)}
	}
	if s.progressDeadline > 0 {
		d.Spec.ProgressDeadlineSeconds = &s.progressDeadline
	}
	if s.progressing != "" {
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: s.progressing, Reason: s.progressingReason},
		}
	}
	return d
}

func TestDeploymentStates(t *testing.T) {
	tests := []struct {
		name     string
		state    depState
		ready    bool
		readyNew int32
		exceeded bool
		served   int64
	}{
		{
			name:  "created, not yet observed by the controller",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 1, want: 2, replicas: 2, updated: 2, available: 2},
			// The counts describe generation 1: they say nothing about the new spec.
			ready: false, readyNew: 0, served: 1,
		},
		{
			name:  "progressing: one new pod up, old pods still there",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 2, want: 2, replicas: 3, updated: 1, available: 2, progressing: corev1.ConditionTrue, progressingReason: "ReplicaSetUpdated"},
			ready: false, readyNew: 0, served: 1,
		},
		{
			name:  "progressing: new pods ready, one old pod left",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 2, want: 2, replicas: 3, updated: 2, available: 3, progressing: corev1.ConditionTrue, progressingReason: "ReplicaSetUpdated"},
			ready: false, readyNew: 2, served: 1,
		},
		{
			name:  "complete",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 2, want: 2, replicas: 2, updated: 2, available: 2, progressing: corev1.ConditionTrue, progressingReason: "NewReplicaSetAvailable"},
			ready: true, readyNew: 2, served: 2,
		},
		{
			name:  "complete, observed generation ahead of a stale read",
			state: depState{release: 3, gen: 3, observedGen: 4, want: 1, replicas: 1, updated: 1, available: 1},
			ready: true, readyNew: 1, served: 3,
		},
		{
			name:  "progress deadline exceeded",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 2, want: 2, replicas: 3, updated: 1, available: 2, progressing: corev1.ConditionFalse, progressingReason: progressDeadlineExceeded},
			ready: false, readyNew: 0, exceeded: true, served: 1,
		},
		{
			name: "deadline exceeded for an older generation does not count",
			// The new spec (generation 3) is not observed yet; the condition is generation 2's.
			state: depState{release: 3, serving: 1, gen: 3, observedGen: 2, want: 2, replicas: 3, updated: 1, available: 2, progressing: corev1.ConditionFalse, progressingReason: progressDeadlineExceeded},
			ready: false, readyNew: 0, exceeded: false, served: 1,
		},
		{
			name:  "old replicas remaining after a scale down",
			state: depState{release: 2, serving: 2, gen: 3, observedGen: 3, want: 1, replicas: 2, updated: 2, available: 2},
			ready: false, readyNew: 2, served: 2,
		},
		{
			name:  "all updated but one not available yet",
			state: depState{release: 2, serving: 1, gen: 2, observedGen: 2, want: 2, replicas: 2, updated: 2, available: 1},
			ready: false, readyNew: 1, served: 1,
		},
		{
			name:  "scaled to zero, pods gone",
			state: depState{release: 2, serving: 2, gen: 4, observedGen: 4, want: 0},
			ready: true, readyNew: 0, served: 2,
		},
		{
			name:  "scaled to zero, pods still stopping",
			state: depState{release: 2, serving: 2, gen: 4, observedGen: 4, want: 0, replicas: 2, updated: 2, available: 2},
			ready: false, readyNew: 2, served: 2,
		},
		{
			name:  "first rollout, nothing served yet",
			state: depState{release: 1, gen: 1, observedGen: 1, want: 1, replicas: 1, updated: 1, available: 0},
			ready: false, readyNew: 0, served: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.state.build()
			if got := deploymentReady(d); got != tt.ready {
				t.Errorf("deploymentReady = %v, want %v", got, tt.ready)
			}
			if got := readyOfTemplate(d); got != tt.readyNew {
				t.Errorf("readyOfTemplate = %d, want %d", got, tt.readyNew)
			}
			if got := deadlineExceeded(d); got != tt.exceeded {
				t.Errorf("deadlineExceeded = %v, want %v", got, tt.exceeded)
			}
			if got := servedRelease(d); got != tt.served {
				t.Errorf("servedRelease = %d, want %d", got, tt.served)
			}
		})
	}
}

func TestStatusOf(t *testing.T) {
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "ns", UID: "u"}}
	webWorker := map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 1}}
	complete := func(release int64, want int32) *appsv1.Deployment {
		return depState{release: release, serving: release, gen: 5, observedGen: 5, want: want, replicas: want, updated: want, available: want,
			progressing: corev1.ConditionTrue, progressingReason: "NewReplicaSetAvailable"}.build()
	}
	rolling := func(release, serving int64, want int32) *appsv1.Deployment {
		return depState{release: release, serving: serving, gen: 6, observedGen: 6, want: want, replicas: want + 1, updated: 1, available: want,
			progressing: corev1.ConditionTrue, progressingReason: "ReplicaSetUpdated"}.build()
	}
	tests := []struct {
		name    string
		d       runtime.Desired
		deps    map[string]*appsv1.Deployment
		pods    []corev1.Pod
		want    runtime.Status
		message string // a substring of Status.Message
	}{
		{
			name: "every process complete",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker},
			deps: map[string]*appsv1.Deployment{"web": complete(3, 2), "worker": complete(3, 1)},
			want: runtime.Status{Serving: 3, RolledOut: true, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 2}, "worker": {Desired: 1, Ready: 1}}},
		},
		{
			name: "web complete, worker still rolling: web serves the new release",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker},
			deps: map[string]*appsv1.Deployment{"web": complete(3, 2), "worker": rolling(3, 2, 1)},
			want: runtime.Status{Serving: 3, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 2}, "worker": {Desired: 1, Ready: 0}}},
			message: "worker 0/1",
		},
		{
			name: "web rolling: the annotated release serves",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker},
			deps: map[string]*appsv1.Deployment{"web": rolling(3, 2, 2), "worker": complete(3, 1)},
			want: runtime.Status{Serving: 2, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 0}, "worker": {Desired: 1, Ready: 1}}},
			message: "release 3: waiting for ready instances (web 0/2)",
		},
		{
			name: "deadline exceeded on web",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker, HealthCheck: &appv1.HealthCheck{Path: "/up"}},
			deps: map[string]*appsv1.Deployment{
				"web": depState{release: 3, serving: 2, gen: 6, observedGen: 6, want: 2, replicas: 3, updated: 1, available: 2,
					progressing: corev1.ConditionFalse, progressingReason: progressDeadlineExceeded, progressDeadline: 45}.build(),
				"worker": complete(3, 1)},
			want: runtime.Status{Serving: 2, Failure: appv1.HealthCheckFailedReason, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 0}, "worker": {Desired: 1, Ready: 1}}},
			message: "the web process of release 3 did not pass the health check (GET /up on PORT) within the boot timeout of 45s (0 of 2 instances ready)",
		},
		{
			name: "web completed after Sync read it: the label lags, the template does not",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker},
			deps: map[string]*appsv1.Deployment{"web": depState{release: 3, serving: 2, gen: 6, observedGen: 6, want: 2, replicas: 2, updated: 2, available: 2}.build(), "worker": rolling(3, 2, 1)},
			want: runtime.Status{Serving: 3, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 2}, "worker": {Desired: 1, Ready: 0}}},
		},
		{
			name: "a Deployment still on the previous template is not this release",
			d:    runtime.Desired{App: app, Release: 4, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}},
			deps: map[string]*appsv1.Deployment{"web": complete(3, 1)},
			want: runtime.Status{Serving: 3, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1, Ready: 0}}},
		},
		{
			name: "suspended and scaled to zero",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker, Suspended: true},
			deps: map[string]*appsv1.Deployment{"web": complete(3, 0), "worker": complete(3, 0)},
			want: runtime.Status{RolledOut: true, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 0}, "worker": {Desired: 0}}},
		},
		{
			name: "suspended, pods still stopping",
			d:    runtime.Desired{App: app, Release: 3, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 2}}, Suspended: true},
			deps: map[string]*appsv1.Deployment{"web": depState{release: 3, serving: 3, gen: 7, observedGen: 7, want: 0, replicas: 2, updated: 2, available: 2}.build()},
			want: runtime.Status{Processes: map[string]runtime.ProcessStatus{"web": {Desired: 0, Ready: 2}}},
		},
		{
			name: "no web process: serving is the oldest completed release",
			d:    runtime.Desired{App: app, Release: 3, Processes: map[string]appv1.ProcessSpec{"a": {Replicas: 1}, "b": {Replicas: 1}}},
			deps: map[string]*appsv1.Deployment{"a": complete(3, 1), "b": rolling(3, 2, 1)},
			want: runtime.Status{Serving: 2, Processes: map[string]runtime.ProcessStatus{"a": {Desired: 1, Ready: 1}, "b": {Desired: 1, Ready: 0}}},
		},
		{
			name: "web crash-looping: fails before the deadline, with the exit",
			d:    runtime.Desired{App: app, Release: 3, Processes: webWorker},
			deps: map[string]*appsv1.Deployment{"web": rolling(3, 2, 2), "worker": complete(3, 1)},
			pods: []corev1.Pod{
				pod("hello-web-b", "web", 3, waiting("CrashLoopBackOff", "", 4, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Killed"})),
				pod("hello-web-a", "web", 3, waiting("CrashLoopBackOff", "", 3, &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"})),
				pod("hello-web-old", "web", 2, running(9)), // the previous release: not counted
				pod("hello-worker-a", "worker", 3, running(1)),
			},
			want: runtime.Status{Serving: 2, Failure: appv1.CrashLoopReason, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 0, Restarts: 7}, "worker": {Desired: 1, Ready: 1, Restarts: 1}}},
			message: "the web process of release 3 cannot run: instance hello-web-a keeps exiting: 3 restarts (last: exited with code 1)",
		},
		{
			name: "web killed by its memory limit: OOMKilled, counted",
			d:    runtime.Desired{App: app, Release: 3, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 2}}},
			deps: map[string]*appsv1.Deployment{"web": rolling(3, 2, 2)},
			pods: []corev1.Pod{
				pod("hello-web-a", "web", 3, waiting("CrashLoopBackOff", "", 3, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"})),
				pod("hello-web-b", "web", 3, waiting("CrashLoopBackOff", "", 4, &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"})),
			},
			want: runtime.Status{Serving: 2, Failure: appv1.OOMKilledReason, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 2, Ready: 0, Restarts: 7, OOMKills: 1}}},
			message: "instance hello-web-a ran out of memory and was killed (3 restarts; last: exited with code 137 (OOMKilled))",
		},
		{
			name: "image cannot be pulled",
			d:    runtime.Desired{App: app, Release: 3, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}},
			deps: map[string]*appsv1.Deployment{"web": rolling(3, 2, 1)},
			pods: []corev1.Pod{pod("hello-web-a", "web", 3, waiting("ImagePullBackOff", "Back-off pulling image \"reg/hello:3\"", 0, nil))},
			want: runtime.Status{Serving: 2, Failure: appv1.ImageNotFoundReason, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 1, Ready: 0}}},
			message: "cannot pull image reg/hello:3: Back-off pulling image",
		},
		{
			name: "restarts of a complete rollout are counted, and are not a failure",
			d:    runtime.Desired{App: app, Release: 3, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}},
			deps: map[string]*appsv1.Deployment{"web": complete(3, 1)},
			pods: []corev1.Pod{pod("hello-web-a", "web", 3, waiting("CrashLoopBackOff", "", 2, nil))},
			want: runtime.Status{Serving: 3, RolledOut: true, Processes: map[string]runtime.ProcessStatus{
				"web": {Desired: 1, Ready: 1, Restarts: 2}}},
		},
		{
			name: "no processes at all",
			d:    runtime.Desired{App: app, Release: 1},
			want: runtime.Status{Serving: 1, RolledOut: true, Processes: map[string]runtime.ProcessStatus{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := statusOf(tt.d, tt.deps, tt.pods)
			msg := got.Message
			got.Message = ""
			if !equalStatus(got, tt.want) {
				t.Errorf("statusOf =\n %+v\nwant\n %+v", got, tt.want)
			}
			if !strings.Contains(msg, tt.message) {
				t.Errorf("message %q does not contain %q", msg, tt.message)
			}
			if got.RolledOut && msg != "" {
				t.Errorf("rolled out with a message %q", msg)
			}
		})
	}
}

// pod is a pod of the app "hello" as its Deployment's template labels it.
func pod(name, process string, release int64, cs corev1.ContainerStatus) corev1.Pod {
	cs.Name, cs.Image = process, "reg/hello:"+strconv.FormatInt(release, 10)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{
			LabelApp: "hello", LabelProcess: process, LabelRelease: strconv.FormatInt(release, 10)}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{cs}},
	}
}

func waiting(reason, message string, restarts int32, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
	return corev1.ContainerStatus{RestartCount: restarts,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}},
		LastTerminationState: corev1.ContainerState{Terminated: last}}
}

func running(restarts int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{RestartCount: restarts, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func equalStatus(a, b runtime.Status) bool {
	if a.Serving != b.Serving || a.RolledOut != b.RolledOut || a.Failure != b.Failure || len(a.Processes) != len(b.Processes) {
		return false
	}
	for k, v := range a.Processes {
		if w, ok := b.Processes[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestProcessOrder(t *testing.T) {
	got := processOrder(map[string]appv1.ProcessSpec{"worker": {}, "clock": {}, "web": {}, "a": {}})
	if strings.Join(got, ",") != "web,a,clock,worker" {
		t.Fatalf("processOrder = %v", got)
	}
}

// TestTimedOutOther: after a withdrawn release the Deployment keeps the
// timed-out condition of the withdrawn ReplicaSet for a while; it is not a
// failure of the release that serves. A timed-out ReplicaSet of this release's
// pods is.
func TestTimedOutOther(t *testing.T) {
	dep := depState{release: 1, serving: 1, gen: 5, observedGen: 5, want: 1, replicas: 2, updated: 1, available: 1,
		progressing: corev1.ConditionFalse, progressingReason: progressDeadlineExceeded, progressDeadline: 10}.build()
	dep.Status.Conditions[1].Message = `ReplicaSet "hello-web-new" has timed out progressing.`
	pod := func(hash string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello-web-" + hash + "-x", Labels: map[string]string{
			LabelProcess: WebProcess, LabelRelease: "1", appsv1.DefaultDeploymentUniqueLabelKey: hash}}}
	}
	d := runtime.Desired{App: &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default", UID: "u"}},
		Release: 1, Image: "img", Processes: map[string]appv1.ProcessSpec{WebProcess: {Replicas: 1}}}
	deps := map[string]*appsv1.Deployment{WebProcess: dep}

	// Back on release 1 (its old ReplicaSet), release 2's pods timed out.
	if st := statusOf(d, deps, []corev1.Pod{pod("old")}); st.Failure != "" {
		t.Errorf("the withdrawn ReplicaSet's deadline fails the release that serves: %s: %s", st.Failure, st.Message)
	}
	// Release 1's own new pods timed out (a health check changed within it).
	if st := statusOf(d, deps, []corev1.Pod{pod("old"), pod("new")}); st.Failure != appv1.HealthCheckFailedReason {
		t.Errorf("a timed-out ReplicaSet of the release: failure %q, want %s", st.Failure, appv1.HealthCheckFailedReason)
	}
	// No pods to tell by: the condition counts.
	if st := statusOf(d, deps, nil); st.Failure != appv1.HealthCheckFailedReason {
		t.Errorf("no pods: failure %q, want %s", st.Failure, appv1.HealthCheckFailedReason)
	}
}
