package deployer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// fakeRuntime plays a runtime inside this package's tests: it reports what the test
// tells it to, per app, and records Syncs and Deletes.
type fakeRuntime struct {
	mu      sync.Mutex
	answer  map[string]func(d runtime.Desired) runtime.Status
	synced  map[string]runtime.Desired
	deleted map[string]bool
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{answer: map[string]func(runtime.Desired) runtime.Status{}, synced: map[string]runtime.Desired{}, deleted: map[string]bool{}}
}

func (f *fakeRuntime) Sync(_ context.Context, d runtime.Desired) (runtime.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced[d.App.Name] = d
	if a := f.answer[d.App.Name]; a != nil {
		return a(d), nil
	}
	// By default every release serves at once.
	return runtime.Status{Serving: d.Release, RolledOut: true, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1, Ready: 1}}}, nil
}

func (f *fakeRuntime) Delete(_ context.Context, app types.NamespacedName) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted[app.Name] = true
	return nil
}

func (f *fakeRuntime) set(app string, a func(runtime.Desired) runtime.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer[app] = a
}

type env struct {
	t   testing.TB
	c   client.Client
	ns  string
	rt  *fakeRuntime
	rec *releases.Recorder
}

// start runs the real reconciler in a manager against the real API server.
func start(t *testing.T, cfg Config) *env {
	t.Helper()
	return startWith(t, cfg, func(f *fakeRuntime) runtime.Runtime { return f })
}

// startWith is start with the runtime wrap makes of the fake one (the fake with
// real images, say).
func startWith(t testing.TB, cfg Config, wrap func(*fakeRuntime) runtime.Runtime) *env {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "deployer")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             controllerConfig(),
		// Only this test's namespace: Apps of earlier tests stay out of its way.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rt := newFakeRuntime()
	r := &AppReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runtime: wrap(rt), Events: mgr.GetEventRecorder("bex-deployer"), Config: cfg}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	return &env{t: t, c: cp.Client, ns: ns, rt: rt, rec: &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}}
}

// controllerConfig lets each test start a manager with a controller of the same name.
func controllerConfig() config.Controller {
	skip := true
	return config.Controller{SkipNameValidation: &skip}
}

func (e *env) app(name string) *appv1.App {
	e.t.Helper()
	app := &appv1.App{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, app); err != nil {
		e.t.Fatal(err)
	}
	return app
}

func (e *env) eventually(what string, f func() error) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, what, f)
}

func (e *env) create(name string) {
	e.t.Helper()
	if err := e.c.Create(context.Background(), &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}); err != nil {
		e.t.Fatal(err)
	}
}

func image(n int) string { return fmt.Sprintf("bex.local/hello@sha256:%064x", n) }

func TestNewAppIsPendingUntilAReleaseServes(t *testing.T) {
	e := start(t, DefaultConfig())
	e.create("hello")
	e.eventually("pending with a finalizer", func() error {
		app := e.app("hello")
		if app.Status.Phase != appv1.AppPhasePending || len(app.Finalizers) == 0 || app.Status.ObservedGeneration != app.Generation {
			return fmt.Errorf("phase %q finalizers %v", app.Status.Phase, app.Finalizers)
		}
		return nil
	})

	// A push's release: the fake runtime first reports a rollout in progress.
	rolling := true
	var mu sync.Mutex
	e.rt.set("hello", func(d runtime.Desired) runtime.Status {
		mu.Lock()
		defer mu.Unlock()
		if rolling {
			return runtime.Status{Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1}}}
		}
		return runtime.Status{Serving: d.Release, RolledOut: true, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1, Ready: 1}}}
	})
	n, err := e.rec.Record(context.Background(), "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./server"}}})
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("deploying", func() error {
		if p := e.app("hello").Status.Phase; p != appv1.AppPhaseDeploying {
			return fmt.Errorf("phase %s", p)
		}
		return nil
	})
	mu.Lock()
	rolling = false
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url, err := e.rec.Wait(ctx, "hello", n, nil)
	if err != nil || url != "https://hello.localhost" {
		t.Fatalf("Wait = %q, %v", url, err)
	}
	app := e.app("hello")
	if app.Status.Phase != appv1.AppPhaseRunning || app.Status.Revision != 1 {
		t.Fatalf("status %+v", app.Status)
	}
	d := e.rt.synced["hello"]
	if d.Image != image(1) || d.Release != 1 || d.Processes["web"].Replicas != 1 || strings.Join(d.Processes["web"].Command, " ") != "./server" {
		t.Fatalf("the runtime was asked for %+v", d)
	}
}

func TestFailedReleaseIsReportedAndWaitSaysWhy(t *testing.T) {
	e := start(t, DefaultConfig())
	e.create("hello")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, _ := e.rec.Record(ctx, "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush})
	if _, err := e.rec.Wait(ctx, "hello", n, nil); err != nil {
		t.Fatal(err)
	}
	e.rt.set("hello", func(d runtime.Desired) runtime.Status {
		return runtime.Status{Serving: 1, Failure: appv1.HealthCheckFailedReason, Message: "web.1 did not answer GET /healthz on port 20001 within 60s."}
	})
	n, _ = e.rec.Record(ctx, "hello", releases.Change{Image: image(2), Cause: appv1.ReleaseCausePush})
	_, err := e.rec.Wait(ctx, "hello", n, nil)
	if !errors.Is(err, releases.ErrRolloutFailed) || !strings.Contains(err.Error(), "within 60s. Release v1 keeps serving.") {
		t.Fatalf("Wait = %v", err)
	}
	app := e.app("hello")
	if app.Status.Phase != appv1.AppPhaseFailed || app.Status.Revision != 1 {
		t.Fatalf("status %+v", app.Status)
	}
	ready := meta.FindStatusCondition(app.Status.Conditions, appv1.ReadyCondition)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != appv1.HealthCheckFailedReason {
		t.Fatalf("Ready %+v", ready)
	}
}

func TestOldReleasesArePruned(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KeepReleases = 2
	e := start(t, cfg)
	e.create("hello")
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		if _, err := e.rec.Record(ctx, "hello", releases.Change{Image: image(i), Cause: appv1.ReleaseCausePush}); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually("pruned to the two newest", func() error {
		rels, err := e.rec.List(ctx, "hello")
		if err != nil {
			return err
		}
		var nums []int64
		for _, r := range rels {
			nums = append(nums, r.Spec.Number)
		}
		if fmt.Sprint(nums) != "[5 4]" {
			return fmt.Errorf("releases %v", nums)
		}
		return nil
	})
}

func TestDeletingAnAppRemovesItsProcesses(t *testing.T) {
	e := start(t, DefaultConfig())
	e.create("hello")
	ctx := context.Background()
	if _, err := e.rec.Record(ctx, "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush}); err != nil {
		t.Fatal(err)
	}
	e.eventually("running", func() error {
		if p := e.app("hello").Status.Phase; p != appv1.AppPhaseRunning {
			return fmt.Errorf("phase %s", p)
		}
		return nil
	})
	if err := e.c.Delete(ctx, e.app("hello")); err != nil {
		t.Fatal(err)
	}
	e.eventually("gone", func() error {
		err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "hello"}, &appv1.App{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	e.rt.mu.Lock()
	deleted := e.rt.deleted["hello"]
	e.rt.mu.Unlock()
	if !deleted {
		t.Fatal("the runtime was not asked to delete the app's processes")
	}
	// No garbage collector runs here, as in bex up: the deployer removes the
	// Releases itself.
	var rels appv1.ReleaseList
	if err := e.c.List(ctx, &rels, client.InNamespace(e.ns)); err != nil || len(rels.Items) != 0 {
		t.Fatalf("releases left after the app was deleted: %d, %v", len(rels.Items), err)
	}
}

func TestSuspendAndResume(t *testing.T) {
	e := start(t, DefaultConfig())
	e.create("hello")
	ctx := context.Background()
	if _, err := e.rec.Record(ctx, "hello", releases.Change{Image: image(1), Cause: appv1.ReleaseCausePush}); err != nil {
		t.Fatal(err)
	}
	setSuspended := func(v bool) { e.updateApp("hello", func(a *appv1.App) { a.Spec.Suspended = v }) }
	setSuspended(true)
	e.eventually("suspended", func() error {
		app := e.app("hello")
		if app.Status.Phase != appv1.AppPhaseSuspended || !e.lastSync("hello").Suspended {
			return fmt.Errorf("phase %s", app.Status.Phase)
		}
		return nil
	})
	setSuspended(false)
	e.eventually("running again, same release", func() error {
		app := e.app("hello")
		if app.Status.Phase != appv1.AppPhaseRunning || app.Status.Revision != 1 || e.lastSync("hello").Suspended {
			return fmt.Errorf("phase %s revision %d", app.Status.Phase, app.Status.Revision)
		}
		return nil
	})
}

// updateApp changes the App as a user's kubectl edit would: read, change,
// write, again on a conflict (the reconciler writes the App too: its finalizer,
// the release it records).
func (e *env) updateApp(name string, change func(*appv1.App)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		app := e.app(name)
		change(app)
		return e.c.Update(context.Background(), app)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) lastSync(app string) runtime.Desired {
	e.rt.mu.Lock()
	defer e.rt.mu.Unlock()
	return e.rt.synced[app]
}

func TestChangesMadeThroughTheAPIBecomeReleases(t *testing.T) {
	e := start(t, DefaultConfig())
	ctx := context.Background()
	// An image set directly on the App (an agent deploying through the API).
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: e.ns}, Spec: appv1.AppSpec{Image: image(7),
		Processes: map[string]appv1.ProcessSpec{"web": {Command: []string{"./server"}, Replicas: 1}}}}
	if err := e.c.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	e.eventually("release 1 recorded for the direct deploy", func() error {
		rels, err := e.rec.List(ctx, "hello")
		if err != nil || len(rels) != 1 || rels[0].Spec.Cause != appv1.ReleaseCauseDeploy || rels[0].Spec.Image != image(7) {
			return fmt.Errorf("releases %v, %v", rels, err)
		}
		if a := e.app("hello"); a.Spec.Release != 1 || a.Status.Phase != appv1.AppPhaseRunning || e.lastSync("hello").Release != 1 {
			return fmt.Errorf("release %d phase %s", a.Spec.Release, a.Status.Phase)
		}
		return nil
	})

	// A config var changed with kubectl edit: release 2, cause Config, run by the runtime.
	e.updateApp("hello", func(a *appv1.App) { a.Spec.Env = []appv1.EnvVar{{Name: "GREETING", Value: "hello"}} })
	e.eventually("release 2 for the config change", func() error {
		rels, _ := e.rec.List(ctx, "hello")
		if len(rels) != 2 || rels[0].Spec.Cause != appv1.ReleaseCauseConfig || len(rels[0].Spec.Config.Env) != 1 {
			return fmt.Errorf("releases %d", len(rels))
		}
		if d := e.lastSync("hello"); d.Release != 2 || len(d.Env) != 1 {
			return fmt.Errorf("the runtime runs %+v", d)
		}
		return nil
	})

	// Scaling is not a release.
	e.updateApp("hello", func(a *appv1.App) {
		a.Spec.Processes["web"] = appv1.ProcessSpec{Command: []string{"./server"}, Replicas: 3}
	})
	e.eventually("scaled without a release", func() error {
		if d := e.lastSync("hello"); d.Processes["web"].Replicas != 3 {
			return fmt.Errorf("replicas %d", d.Processes["web"].Replicas)
		}
		return nil
	})
	rels, _ := e.rec.List(ctx, "hello")
	if len(rels) != 2 || e.app("hello").Spec.Release != 2 {
		t.Fatalf("scaling made a release: %d releases", len(rels))
	}

	// A rollback is a new release with the old image and config.
	n, err := e.rec.Rollback(ctx, "hello", 1, "ana")
	if err != nil || n != 3 {
		t.Fatalf("Rollback = %d, %v", n, err)
	}
	e.eventually("rolled back", func() error {
		d := e.lastSync("hello")
		if d.Release != 3 || len(d.Env) != 0 || d.Image != image(7) || d.Processes["web"].Replicas != 3 {
			return fmt.Errorf("the runtime runs %+v", d)
		}
		return nil
	})
	if rels, _ := e.rec.List(ctx, "hello"); len(rels) != 3 {
		t.Fatalf("%d releases after the rollback, want 3 (no extra release from the reconciler)", len(rels))
	}
}

// A config change recorded through the Recorder (ssh config:set) is one release:
// the reconciler sees the spec match its release and records nothing more. A
// restart annotation reaches the runtime as the process type's restart token.
func TestRecordedChangeIsOneReleaseAndRestartsReachTheRuntime(t *testing.T) {
	e := start(t, DefaultConfig())
	ctx := context.Background()
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: e.ns}}
	if err := e.c.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rec.Record(ctx, "hello", releases.Change{Image: image(1), Processes: map[string][]string{"web": nil, "worker": {"./w"}}, Cause: appv1.ReleaseCausePush}); err != nil {
		t.Fatal(err)
	}
	n, err := e.rec.Record(ctx, "hello", releases.Change{Env: []appv1.EnvVar{{Name: "A", Value: "a b;$(x)"}}, SetEnv: true, Cause: appv1.ReleaseCauseConfig, Actor: "ana"})
	if err != nil || n != 2 {
		t.Fatalf("Record = %d, %v", n, err)
	}
	e.eventually("release 2 runs", func() error {
		if d := e.lastSync("hello"); d.Release != 2 || len(d.Env) != 1 || d.Env[0].Value != "a b;$(x)" {
			return fmt.Errorf("the runtime runs %+v", d)
		}
		return nil
	})
	e.updateApp("hello", func(a *appv1.App) {
		a.Annotations = map[string]string{appv1.RestartedAtAnnotation + ".worker": "2026-01-01T00:00:00Z"}
	})
	e.eventually("the restart reaches the runtime", func() error {
		if r := e.lastSync("hello").Restarts; r["worker"] != "/2026-01-01T00:00:00Z" || r["web"] != "" {
			return fmt.Errorf("restarts %v", r)
		}
		return nil
	})
	if rels, _ := e.rec.List(ctx, "hello"); len(rels) != 2 {
		t.Fatalf("%d releases, want 2: the reconciler recorded one of its own", len(rels))
	}
}
