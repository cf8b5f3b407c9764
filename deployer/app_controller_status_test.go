package deployer

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

func TestStatusFromRuntime(t *testing.T) {
	web := map[string]runtime.ProcessStatus{"web": {Desired: 2, Ready: 1, Restarts: 3}}
	cases := []struct {
		name      string
		spec      appv1.AppSpec
		prior     []metav1.Condition
		synced    bool
		st        runtime.Status
		phase     appv1.AppPhase
		rolled    metav1.ConditionStatus
		reason    string
		ready     metav1.ConditionStatus
		revision  int64
		inMessage string
	}{
		{name: "nothing pushed", spec: appv1.AppSpec{}, phase: appv1.AppPhasePending,
			rolled: metav1.ConditionFalse, reason: appv1.NoReleaseReason, ready: metav1.ConditionFalse, inMessage: "push to the app's deploy branch"},
		{name: "rolling out", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 2}, synced: true,
			st:    runtime.Status{Serving: 1, Processes: web},
			phase: appv1.AppPhaseDeploying, rolled: metav1.ConditionFalse, reason: appv1.RollingOutReason, ready: metav1.ConditionFalse,
			revision: 1, inMessage: "Rolling out release v2: web 1/2 ready, 3 restarts."},
		{name: "rolling out with a note", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 2}, synced: true,
			st:    runtime.Status{Serving: 1, Processes: web, Note: "web stop before their new instances start: a short downtime."},
			phase: appv1.AppPhaseDeploying, rolled: metav1.ConditionFalse, reason: appv1.RollingOutReason, ready: metav1.ConditionFalse,
			revision: 1, inMessage: "Rolling out release v2: web 1/2 ready, 3 restarts. web stop before their new instances start: a short downtime."},
		{name: "rolled out", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 2}, synced: true,
			st:    runtime.Status{Serving: 2, RolledOut: true, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 2, Ready: 2}}},
			phase: appv1.AppPhaseRunning, rolled: metav1.ConditionTrue, reason: appv1.RolledOutReason, ready: metav1.ConditionTrue,
			revision: 2, inMessage: "Release v2 serves: web 2/2 ready."},
		{name: "new release failed, old one serves", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 3}, synced: true,
			st:    runtime.Status{Serving: 2, Failure: appv1.HealthCheckFailedReason, Message: "web.1 did not answer on port 20001 within 60s."},
			phase: appv1.AppPhaseFailed, rolled: metav1.ConditionFalse, reason: appv1.HealthCheckFailedReason, ready: metav1.ConditionFalse,
			revision: 2, inMessage: "within 60s. Release v2 keeps serving."},
		{name: "crash loop", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 1}, synced: true,
			st:    runtime.Status{Failure: appv1.CrashLoopReason, Message: "web.1 exited 5 times."},
			phase: appv1.AppPhaseFailed, rolled: metav1.ConditionFalse, reason: appv1.CrashLoopReason, ready: metav1.ConditionFalse},
		{name: "suspended", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 1, Suspended: true}, synced: true,
			st:    runtime.Status{RolledOut: true},
			phase: appv1.AppPhaseSuspended, rolled: metav1.ConditionTrue, reason: appv1.SuspendedReason, ready: metav1.ConditionFalse, inMessage: "suspended"},
		{name: "runtime unreachable keeps what was known", spec: appv1.AppSpec{Image: "x@sha256:1", Release: 1},
			prior: []metav1.Condition{{Type: appv1.RolledOutCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason, Message: "Release v1 serves."}},
			phase: appv1.AppPhaseRunning, rolled: metav1.ConditionTrue, reason: appv1.RolledOutReason, ready: metav1.ConditionTrue, revision: 1},
	}
	r := &AppReconciler{Config: DefaultConfig()}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Generation: 4}, Spec: tc.spec}
			app.Status.Conditions = tc.prior
			app.Status.Revision = tc.revision
			r.updateStatus(&scope{app: app, synced: tc.synced, status: tc.st})
			if app.Status.Phase != tc.phase {
				t.Errorf("phase %s, want %s", app.Status.Phase, tc.phase)
			}
			rolled := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition)
			if rolled == nil || rolled.Status != tc.rolled || rolled.Reason != tc.reason || !strings.Contains(rolled.Message, tc.inMessage) {
				t.Errorf("RolledOut = %+v, want %s/%s containing %q", rolled, tc.rolled, tc.reason, tc.inMessage)
			}
			ready := meta.FindStatusCondition(app.Status.Conditions, appv1.ReadyCondition)
			if ready == nil || ready.Status != tc.ready {
				t.Errorf("Ready = %+v, want %s", ready, tc.ready)
			}
			if app.Status.Revision != tc.revision {
				t.Errorf("revision %d, want %d", app.Status.Revision, tc.revision)
			}
			if app.Status.URL != "https://hello.localhost" {
				t.Errorf("url %s", app.Status.URL)
			}
		})
	}
}

func TestAppURL(t *testing.T) {
	cfg := DefaultConfig()
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello"}}
	if got := appURL(app, cfg); got != "https://hello.localhost" {
		t.Errorf("default: %s", got)
	}
	cfg.HTTPSPort = 8443
	if got := appURL(app, cfg); got != "https://hello.localhost:8443" {
		t.Errorf("unprivileged port: %s", got)
	}
	app.Spec.Domains = []string{"www.example.com"}
	if got := appURL(app, cfg); got != "https://www.example.com:8443" {
		t.Errorf("custom domain: %s", got)
	}
	app.Spec.Domains = []string{"*.example.com"}
	if got := appURL(app, cfg); got != "https://hello.localhost:8443" {
		t.Errorf("wildcard domain: %s", got)
	}
}
