package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// FakeDeployer plays the deployer's part for the Apps of one namespace, for tests
// of what comes before it (the gitserver, the ssh commands, the webhooks): envtest
// and the fake client run no controller, and a push or a config change waits for
// its release to serve. It writes the status a deployer writes: a release it
// serves gets Phase Running (Suspended when the spec says so), Revision = spec.release, URL https://APP.localhost,
// Ready and RolledOut true, observedGeneration = the App's generation; a release
// marked with Fail gets RolledOut false with the given reason and message, and
// Phase Failed, its Revision left at the release that served before.
//
// Start one with StartFakeDeployer; it stops when its context ends or its test
// does, whichever comes first.
type FakeDeployer struct {
	c  client.Client
	ns string

	mu    sync.Mutex
	upTo  int64 // releases numbered above it wait; 0: none waits
	fails map[appRelease]metav1.Condition
}

type appRelease struct {
	app     string
	release int64
}

// StartFakeDeployer starts a FakeDeployer for the Apps in namespace, read and
// written with c (any controller-runtime client: a real API server's or a fake).
// It looks at the Apps every 20 ms (a controller would watch; polling works with
// every client and is no wait of the test's own). The test's cleanup waits for
// it to stop, so nothing writes after the test ends.
func StartFakeDeployer(ctx context.Context, t testing.TB, c client.Client, namespace string) *FakeDeployer {
	t.Helper()
	d := &FakeDeployer{c: c, ns: namespace, fails: map[appRelease]metav1.Condition{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			d.pass(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// ServeUpTo makes releases numbered above n wait, unserved and with no status
// written, until a later ServeUpTo lets them through; ServeUpTo(0) lets every
// release through (the default). A test holds a rollout with it to see what
// happens meanwhile.
func (d *FakeDeployer) ServeUpTo(n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.upTo = n
}

// Fail makes release of app fail its rollout with reason (one of the API's
// reasons, such as appv1.HealthCheckFailedReason) and message, as the deployer
// reports a release whose instances never answer.
func (d *FakeDeployer) Fail(app string, release int64, reason, message string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fails[appRelease{app, release}] = metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

// pass writes the status of every App whose spec it has not answered yet.
func (d *FakeDeployer) pass(ctx context.Context) {
	var apps appv1.AppList
	if err := d.c.List(ctx, &apps, client.InNamespace(d.ns)); err != nil {
		return // the next pass reads again
	}
	d.mu.Lock()
	upTo := d.upTo
	fails := make(map[appRelease]metav1.Condition, len(d.fails))
	for k, v := range d.fails {
		fails[k] = v
	}
	d.mu.Unlock()
	for i := range apps.Items {
		a := &apps.Items[i]
		n := a.Spec.Release
		if n == 0 || (upTo > 0 && n > upTo) {
			continue
		}
		if fail, ok := fails[appRelease{a.Name, n}]; ok {
			if a.Status.ObservedGeneration == a.Generation && a.Status.Phase == appv1.AppPhaseFailed {
				continue
			}
			fail.ObservedGeneration = a.Generation
			meta.SetStatusCondition(&a.Status.Conditions, fail)
			meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionFalse,
				Reason: fail.Reason, Message: fail.Message, ObservedGeneration: a.Generation})
			a.Status.Phase, a.Status.ObservedGeneration = appv1.AppPhaseFailed, a.Generation
		} else {
			phase := appv1.AppPhaseRunning
			if a.Spec.Suspended {
				phase = appv1.AppPhaseSuspended
			}
			if a.Status.Revision == n && a.Status.ObservedGeneration == a.Generation && a.Status.Phase == phase {
				continue
			}
			a.Status.Phase, a.Status.Revision, a.Status.ObservedGeneration = phase, n, a.Generation
			a.Status.URL = "https://" + a.Name + ".localhost"
			for _, typ := range []string{appv1.RolledOutCondition, appv1.ReadyCondition} {
				meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue,
					Reason: appv1.RolledOutReason, ObservedGeneration: a.Generation})
			}
		}
		// A conflict (the App changed since the List) is answered by the next pass.
		_ = d.c.Status().Update(ctx, a)
	}
}
