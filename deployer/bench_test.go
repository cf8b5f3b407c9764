package deployer

import (
	"context"
	"fmt"
	goruntime "runtime"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
)

// BenchmarkReconcileManyApps creates n Apps with an image each and measures, with
// the real reconciler and the Kubernetes runtime on envtest, the time until every App
// is reconciled (its release recorded, its Deployment and Service applied, its status
// observed for the current generation), and the heap of this process — the manager
// with its caches — once they are. 250 and 1,000 Apps run in the same benchmark, so
// the per-app figures show whether growth is linear.
func BenchmarkReconcileManyApps(b *testing.B) {
	cp := testenv.SharedControlPlane(b)
	for _, n := range []int{250, 1000} {
		b.Run(fmt.Sprintf("apps=%d", n), func(b *testing.B) {
			var total time.Duration
			var heap uint64
			for b.Loop() {
				d, h := reconcileMany(b, cp, n)
				total += d
				heap = max(heap, h)
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/all")
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N*n), "ms/app")
			b.ReportMetric(float64(heap)/(1<<20), "heap-MB")
		})
	}
}

func reconcileMany(b *testing.B, cp *testenv.ControlPlane, n int) (time.Duration, uint64) {
	ns := cp.Namespace(b, "many")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: controllerConfig(), Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}})
	if err != nil {
		b.Fatal(err)
	}
	rt, err := kube.New(kube.Config{}, mgr.GetClient())
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Concurrency = 8
	cfg.WatchDeployments, cfg.RequeueWhileRolling = true, 30*time.Second
	if err := (&AppReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runtime: rt, Config: cfg}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", i), Namespace: ns},
				Spec: appv1.AppSpec{Image: image(i + 1), Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}}
			if err := cp.Client.Create(ctx, app); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	for {
		var list appv1.AppList
		if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		done := 0
		for _, a := range list.Items {
			if a.Spec.Release > 0 && a.Status.ObservedGeneration == a.Generation && a.Status.Phase == appv1.AppPhaseDeploying {
				done++
			}
		}
		if done == n {
			break
		}
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("%d of %d apps reconciled after 10 minutes", done, n)
		}
		time.Sleep(100 * time.Millisecond) // no wait: the poll that is measured (a List of every App; a finer one would load the API server it measures)
	}
	took := time.Since(start)
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return took, ms.HeapInuse
}
