package deployer

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
)

// TestReconcilerWithTheKubernetesRuntime runs the real reconciler with the real
// Kubernetes runtime on envtest. No kube-controller-manager runs there, so the test
// plays its part: it marks the Deployment's rollout complete.
func TestReconcilerWithTheKubernetesRuntime(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "kube-e2e")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Controller: controllerConfig(),
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := kube.New(kube.Config{}, mgr.GetClient())
	if err != nil {
		t.Fatal(err)
	}
	if err := (&AppReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runtime: rt, Events: mgr.GetEventRecorder("bex-deployer"), Config: kubeConfig()}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns},
		Spec: appv1.AppSpec{Env: []appv1.EnvVar{{Name: "GREETING", Value: "hi"}}}}); err != nil {
		t.Fatal(err)
	}
	rec := &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	n, err := rec.Record(ctx, "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush, Processes: map[string][]string{"web": {"./server"}}})
	if err != nil {
		t.Fatal(err)
	}

	// The reconciler creates the web Deployment and its Service, owned by the App.
	dep := &appsv1.Deployment{}
	testenv.Eventually(t, 20*time.Second, "the Deployment hello-web and the Service hello", func() error {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hello-web"}, dep); err != nil {
			return err
		}
		return cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hello"}, &corev1.Service{})
	})
	if c := dep.Spec.Template.Spec.Containers[0]; c.Image != image(1) || fmt.Sprint(c.Command) != "[./server]" || len(dep.OwnerReferences) != 1 {
		t.Fatalf("deployment %+v owners %+v", c, dep.OwnerReferences)
	}
	testenv.Eventually(t, 20*time.Second, "phase Deploying before the rollout completes", func() error {
		if p := getPhase(t, cp.Client, ns); p != appv1.AppPhaseDeploying {
			return fmt.Errorf("phase %s", p)
		}
		return nil
	})

	// The cluster's part: the rollout completes.
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := cp.Client.Status().Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	url, err := rec.Wait(wctx, "hello", n, nil)
	if err != nil || url != "https://hello.localhost" {
		t.Fatalf("Wait = %q, %v", url, err)
	}
	if p := getPhase(t, cp.Client, ns); p != appv1.AppPhaseRunning {
		t.Fatalf("phase %s", p)
	}
}

func getPhase(t *testing.T, c client.Client, ns string) appv1.AppPhase {
	t.Helper()
	app := &appv1.App{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hello"}, app); err != nil {
		t.Fatal(err)
	}
	return app.Status.Phase
}

// kubeConfig is the reconciler's configuration with the Kubernetes runtime, as bex
// deployer sets it: Deployment events drive the rollout.
func kubeConfig() Config {
	cfg := DefaultConfig()
	cfg.WatchDeployments, cfg.RequeueWhileRolling = true, 30*time.Second
	return cfg
}
