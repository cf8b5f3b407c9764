package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestFakeDeployerServesHoldsAndFails: against the real API server, a release is
// reported serving, a release above ServeUpTo waits (while another app's is
// served, so a pass went by), and a release marked with Fail fails its rollout
// with the revision left at the one that served.
func TestFakeDeployerServesHoldsAndFails(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "fakedeployer")
	ctx := context.Background()
	d := testenv.StartFakeDeployer(ctx, t, cp.Client, ns)
	d.ServeUpTo(1)

	get := func(name string) *appv1.App {
		t.Helper()
		a := &appv1.App{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	serves := func(name string, n int64) func() error {
		return func() error {
			a := get(name)
			ready := meta.FindStatusCondition(a.Status.Conditions, appv1.ReadyCondition)
			if a.Status.Phase != appv1.AppPhaseRunning || a.Status.Revision != n || a.Status.ObservedGeneration != a.Generation ||
				ready == nil || ready.Status != metav1.ConditionTrue || a.Status.URL != "https://"+name+".localhost" {
				return fmt.Errorf("status %+v", a.Status)
			}
			return nil
		}
	}
	create := func(name string) {
		t.Helper()
		if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: appv1.AppSpec{Image: "bex.local/" + name + "@sha256:" + fmt.Sprintf("%064d", 1), Release: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	release := func(name string, n int64) {
		t.Helper()
		a := get(name)
		a.Spec.Release = n
		if err := cp.Client.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
	}

	create("web")
	testenv.Eventually(t, 10*time.Second, "release 1 of web served", serves("web", 1))

	// Release 2 is held: an app created after it is served, web's is not.
	release("web", 2)
	create("probe")
	testenv.Eventually(t, 10*time.Second, "release 1 of probe served", serves("probe", 1))
	if a := get("web"); a.Status.Revision != 1 || a.Status.ObservedGeneration == a.Generation {
		t.Fatalf("release 2 above ServeUpTo(1) was answered: %+v", a.Status)
	}
	d.ServeUpTo(0)
	testenv.Eventually(t, 10*time.Second, "release 2 of web served", serves("web", 2))

	d.Fail("web", 3, appv1.HealthCheckFailedReason, "web.1 never answered on /healthz")
	release("web", 3)
	testenv.Eventually(t, 10*time.Second, "release 3 of web failed", func() error {
		a := get("web")
		rolled := meta.FindStatusCondition(a.Status.Conditions, appv1.RolledOutCondition)
		if a.Status.Phase != appv1.AppPhaseFailed || a.Status.Revision != 2 || a.Status.ObservedGeneration != a.Generation ||
			rolled == nil || rolled.Status != metav1.ConditionFalse || rolled.Reason != appv1.HealthCheckFailedReason ||
			rolled.Message != "web.1 never answered on /healthz" {
			return fmt.Errorf("status %+v", a.Status)
		}
		return nil
	})
}
