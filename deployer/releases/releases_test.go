package releases_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
const digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

// setup makes a namespace with one App and returns a Recorder for it.
func setup(t *testing.T) (*releases.Recorder, client.Client) {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "rel")
	ctx := context.Background()
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns}, Spec: appv1.AppSpec{Env: []appv1.EnvVar{{Name: "GREETING", Value: "hi"}}}}
	if err := cp.Client.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	return &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}, cp.Client
}

func getApp(t *testing.T, c client.Client, ns string) *appv1.App {
	t.Helper()
	app := &appv1.App{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hello"}, app); err != nil {
		t.Fatal(err)
	}
	return app
}

func TestRecordCreatesAReleaseAndPointsTheAppAtIt(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	commit := strings.Repeat("c", 40)
	n, err := r.Record(ctx, "hello", releases.Change{
		Image: "bex.local/hello@" + digestA, Commit: commit, Cause: appv1.ReleaseCausePush, Actor: "ana",
		Processes: map[string][]string{"web": {"/bin/sh", "-c", "./server"}, "worker": {"/bin/sh", "-c", "./worker"}},
	})
	if err != nil || n != 1 {
		t.Fatalf("Record = %d, %v", n, err)
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Release != 1 || app.Spec.Image != "bex.local/hello@"+digestA {
		t.Fatalf("app spec %+v", app.Spec)
	}
	if app.Spec.Processes["web"].Replicas != 1 || app.Spec.Processes["worker"].Replicas != 0 {
		t.Fatalf("first release scale: %+v", app.Spec.Processes)
	}
	rels, err := r.List(ctx, "hello")
	if err != nil || len(rels) != 1 {
		t.Fatalf("List = %v, %v", rels, err)
	}
	rel := rels[0]
	if rel.Name != "hello-v1" || rel.Spec.Commit != commit || rel.Spec.Actor != "ana" || rel.Spec.Description != "Deploy ccccccc" ||
		len(rel.Spec.Config.Env) != 1 || rel.Spec.Config.Env[0].Value != "hi" {
		t.Fatalf("release %+v", rel.Spec)
	}
	if len(rel.OwnerReferences) != 1 || rel.OwnerReferences[0].UID != app.UID {
		t.Fatalf("owner references %+v", rel.OwnerReferences)
	}

	// A second release keeps the scale that was set in between.
	app.Spec.Processes["worker"] = appv1.ProcessSpec{Command: app.Spec.Processes["worker"].Command, Replicas: 3}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	n, err = r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestB, Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./server"}, "worker": {"./worker"}}})
	if err != nil || n != 2 {
		t.Fatalf("second Record = %d, %v", n, err)
	}
	if app := getApp(t, c, r.Namespace); app.Spec.Processes["worker"].Replicas != 3 {
		t.Fatalf("scale lost: %+v", app.Spec.Processes)
	}
}

func TestConcurrentRecordsGetDistinctNumbers(t *testing.T) {
	r, c := setup(t)
	var wg sync.WaitGroup
	nums := make([]int64, 5)
	for i := range nums {
		wg.Go(func() {
			n, err := r.Record(context.Background(), "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCauseDeploy})
			if err != nil {
				t.Error(err)
			}
			nums[i] = n
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for _, n := range nums {
		if seen[n] {
			t.Fatalf("number %d given twice: %v", n, nums)
		}
		seen[n] = true
	}
	if got := getApp(t, c, r.Namespace).Spec.Release; got < 5 {
		t.Fatalf("app at release %d after 5 records", got)
	}
}

func TestRecordNeedsAnImage(t *testing.T) {
	r, _ := setup(t)
	_, err := r.Record(context.Background(), "hello", releases.Change{Cause: appv1.ReleaseCauseConfig})
	if err == nil || !strings.Contains(err.Error(), "has no image yet: push code first") {
		t.Fatalf("Record without an image: %v", err)
	}
}

// setStatus plays the deployer's part: envtest runs no controller. Each test
// writes its own sequence of statuses (progress, failure, success), which the
// harness's FakeDeployer does not: it answers every release at once.
func setStatus(t *testing.T, c client.Client, ns string, revision int64, conds ...metav1.Condition) {
	t.Helper()
	if err := updateStatus(c, ns, revision, conds...); err != nil {
		t.Fatal(err)
	}
}

// updateStatus is setStatus for a goroutine other than the test's.
func updateStatus(c client.Client, ns string, revision int64, conds ...metav1.Condition) error {
	app := &appv1.App{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hello"}, app); err != nil {
		return err
	}
	app.Status.Revision = revision
	app.Status.URL = "https://hello.bex.test"
	app.Status.ObservedGeneration = app.Generation
	for _, cond := range conds {
		cond.ObservedGeneration = app.Generation
		meta.SetStatusCondition(&app.Status.Conditions, cond)
	}
	return c.Status().Update(context.Background(), app)
}

func TestWaitReturnsTheURLWhenTheReleaseServes(t *testing.T) {
	r, c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush})
	if err != nil {
		t.Fatal(err)
	}
	var progress []string
	var mu sync.Mutex
	// The deployer reports progress, and the release serving once Wait has passed
	// the progress on.
	setStatus(t, c, r.Namespace, 0, metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: appv1.RollingOutReason, Message: "web.1 starting"})
	told := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		select {
		case <-told:
		case <-ctx.Done():
			served <- ctx.Err()
			return
		}
		served <- updateStatus(c, r.Namespace, n,
			metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason, Message: "release v1 serves"},
			metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason})
	}()
	url, err := r.Wait(ctx, "hello", n, func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if progress = append(progress, s); len(progress) == 1 {
			close(told)
		}
	})
	if err != nil || url != "https://hello.bex.test" {
		t.Fatalf("Wait = %q, %v", url, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the status update: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(progress) == 0 || progress[0] != "web.1 starting" {
		t.Fatalf("progress = %q", progress)
	}
}

func TestWaitReportsAFailedRollout(t *testing.T) {
	r, c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush})
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, c, r.Namespace, 0, metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse,
		Reason: appv1.HealthCheckFailedReason, Message: "web.1 did not answer on PORT within 60s"})
	_, err = r.Wait(ctx, "hello", n, nil)
	if !errors.Is(err, releases.ErrRolloutFailed) || !strings.Contains(err.Error(), "web.1 did not answer on PORT within 60s") {
		t.Fatalf("Wait = %v", err)
	}
	// Without an answer from the deployer, Wait ends with its context.
	n, _ = r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestB, Cause: appv1.ReleaseCausePush})
	short, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	if _, err := r.Wait(short, "hello", n, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait without a deployer = %v", err)
	}
}

func TestRollbackBringsBackImageCommandsAndConfigButNotScale(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	if _, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./v1"}}}); err != nil {
		t.Fatal(err)
	}
	app := getApp(t, c, r.Namespace)
	app.Spec.Env = []appv1.EnvVar{{Name: "GREETING", Value: "changed"}}
	app.Spec.Processes["web"] = appv1.ProcessSpec{Command: []string{"./v1"}, Replicas: 3}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestB, Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./v2"}}}); err != nil {
		t.Fatal(err)
	}
	n, err := r.Rollback(ctx, "hello", 1, "ana")
	if err != nil || n != 3 {
		t.Fatalf("Rollback = %d, %v", n, err)
	}
	app = getApp(t, c, r.Namespace)
	if app.Spec.Image != "bex.local/hello@"+digestA || app.Spec.Release != 3 || app.Spec.Env[0].Value != "hi" ||
		strings.Join(app.Spec.Processes["web"].Command, " ") != "./v1" || app.Spec.Processes["web"].Replicas != 3 {
		t.Fatalf("after rollback: %+v", app.Spec)
	}
	rels, _ := r.List(ctx, "hello")
	if rels[0].Spec.Cause != appv1.ReleaseCauseRollback || rels[0].Spec.RollbackOf != 1 || rels[0].Spec.Description != "Rollback to v1" || rels[0].Spec.Actor != "ana" {
		t.Fatalf("rollback release %+v", rels[0].Spec)
	}
	if _, err := r.Rollback(ctx, "hello", 42, "ana"); err == nil || !strings.Contains(err.Error(), "has no release v42") {
		t.Fatalf("rollback to a missing release: %v", err)
	}
}

// An image built from a Dockerfile without a Procfile brings no process types; its
// first release runs the image's own command as web, as Heroku and Dokku do, and a
// later one keeps the scale.
func TestFirstImageWithoutProcessTypesRunsWeb(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	if _, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush}); err != nil {
		t.Fatal(err)
	}
	app := getApp(t, c, r.Namespace)
	if web, ok := app.Spec.Processes["web"]; len(app.Spec.Processes) != 1 || !ok || web.Replicas != 1 || web.Command != nil {
		t.Fatalf("processes after the first image: %+v", app.Spec.Processes)
	}
	app.Spec.Processes["web"] = appv1.ProcessSpec{Replicas: 2}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestB, Cause: appv1.ReleaseCausePush}); err != nil {
		t.Fatal(err)
	}
	if app := getApp(t, c, r.Namespace); app.Spec.Processes["web"].Replicas != 2 {
		t.Fatalf("scale lost: %+v", app.Spec.Processes)
	}
}

// A failed release is withdrawn: the App asks again for the release that serves, with
// its image, commands and config but the current scale, and the failed Release says
// why. A revert that comes too late (the App moved on) changes nothing.
func TestRevertGoesBackToTheServingRelease(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	v1, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./old"}}})
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, c, r.Namespace, v1)
	app := getApp(t, c, r.Namespace)
	gig := resource.MustParse("1Gi")
	app.Spec.Processes["web"] = appv1.ProcessSpec{Command: []string{"./old"}, Replicas: 3, Resources: &appv1.Resources{Memory: &gig}}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	v2, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestB, Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./new"}}, Env: []appv1.EnvVar{{Name: "NEW", Value: "1"}}, SetEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Revert(ctx, "hello", v2, "web.1 did not answer"); err != nil {
		t.Fatal(err)
	}
	app = getApp(t, c, r.Namespace)
	if app.Spec.Release != v1 || app.Spec.Image != "bex.local/hello@"+digestA || app.Spec.Processes["web"].Command[0] != "./old" ||
		app.Spec.Processes["web"].Replicas != 3 || len(app.Spec.Env) != 1 || app.Spec.Env[0].Name != "GREETING" {
		t.Fatalf("after the revert: %+v", app.Spec)
	}
	// The limits set after v1 (ps:resources, no release) stay, as the scale does.
	if r := app.Spec.Processes["web"].Resources; r == nil || r.Memory == nil || r.Memory.Cmp(gig) != 0 {
		t.Fatalf("resources after the revert: %+v", r)
	}
	rels, err := r.List(ctx, "hello")
	if err != nil || len(rels) != 2 || rels[0].Annotations[releases.AnnotationFailed] != "web.1 did not answer" {
		t.Fatalf("releases after the revert: %v, %v", rels, err)
	}
	// The next release takes the next number; the failed one stays in the history.
	if v3, err := r.Record(ctx, "hello", releases.Change{Cause: appv1.ReleaseCauseConfig}); err != nil || v3 != v2+1 {
		t.Fatalf("next release = %d, %v", v3, err)
	}
	if err := r.Revert(ctx, "hello", v2, "late"); err != nil {
		t.Fatal(err)
	}
	if app := getApp(t, c, r.Namespace); app.Spec.Release != v2+1 {
		t.Fatalf("a late revert moved the App to %d", app.Spec.Release)
	}
}

// With a client that watches, Wait follows the App's changes: it sees the
// release serve, and the progress before it, with no read on a timer (the
// poll interval is an hour, longer than the test may take).
func TestWaitWatchesTheApp(t *testing.T) {
	r, c := setup(t)
	cp := testenv.SharedControlPlane(t)
	watching, err := client.NewWithWatch(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	r.Client, r.PollInterval = watching, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := r.Record(ctx, "hello", releases.Change{Image: "bex.local/hello@" + digestA, Cause: appv1.ReleaseCausePush})
	if err != nil {
		t.Fatal(err)
	}
	told := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		// Progress first, written after Wait began; the release serving once
		// Wait passed it on.
		if err := updateStatus(c, r.Namespace, 0, metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: appv1.RollingOutReason, Message: "web.1 starting"}); err != nil {
			served <- err
			return
		}
		select {
		case <-told:
		case <-ctx.Done():
			served <- ctx.Err()
			return
		}
		served <- updateStatus(c, r.Namespace, n,
			metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason, Message: "release v1 serves"},
			metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason})
	}()
	var once sync.Once
	url, err := r.Wait(ctx, "hello", n, func(s string) {
		if s == "web.1 starting" {
			once.Do(func() { close(told) })
		}
	})
	if err != nil || url != "https://hello.bex.test" {
		t.Fatalf("Wait = %q, %v", url, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("the status update: %v", err)
	}
}
