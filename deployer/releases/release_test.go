package releases_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// fakeOneOffs records each run and exits with exit, printing what the command
// saw of GREETING.
type fakeOneOffs struct {
	mu   sync.Mutex
	runs []runtime.OneOff
	exit int
}

func (f *fakeOneOffs) Run(ctx context.Context, o runtime.OneOff) (int, error) {
	f.mu.Lock()
	f.runs = append(f.runs, o)
	f.mu.Unlock()
	for _, e := range o.Env {
		if e.Name == "GREETING" && o.Stdout != nil {
			fmt.Fprintf(o.Stdout, "migrating %s\n", e.Value)
		}
	}
	return f.exit, nil
}

func (f *fakeOneOffs) Start(ctx context.Context, o runtime.OneOff, done func(int)) error {
	return errors.New("not used")
}

func (f *fakeOneOffs) count(process string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.runs {
		if o.Process == process {
			n++
		}
	}
	return n
}

func push(image string, scripts *appv1.Scripts, aj *releases.AppJSON, progress *bytes.Buffer) releases.Change {
	ch := releases.Change{Image: "bex.local/hello@" + image, Commit: strings.Repeat("c", 40), Cause: appv1.ReleaseCausePush,
		Processes: map[string][]string{"web": {"./web"}, "worker": {"./worker"}},
		Code:      &releases.Code{Scripts: scripts}, AppJSON: aj}
	if progress != nil {
		ch.Progress = progress
	}
	return ch
}

func TestReleaseCommandRunsOnceWithTheNewConfig(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{}
	r.OneOffs = f
	ctx := context.Background()
	var out bytes.Buffer
	if _, err := r.Record(ctx, "hello", push(digestA, &appv1.Scripts{Release: []string{"./migrate"}}, nil, &out)); err != nil {
		t.Fatal(err)
	}
	if f.count("release") != 1 || f.runs[0].Image != "bex.local/hello@"+digestA || f.runs[0].Release != 1 ||
		f.runs[0].Timeout.Seconds() != appv1.DefaultReleaseTimeoutSeconds || strings.Join(f.runs[0].Command, " ") != "./migrate" {
		t.Fatalf("runs %+v", f.runs)
	}
	// The command is written as a process's command is: the runtime expands it.
	if !f.runs[0].Expand {
		t.Errorf("the release command runs with Expand false: $$ and $(NAME) would reach it escaped")
	}
	if !strings.Contains(out.String(), "migrating hi") {
		t.Fatalf("progress %q", out.String())
	}
	// config:set runs it with the config after the edit.
	out.Reset()
	n, err := r.RecordConfig(ctx, "hello", func(env []appv1.EnvVar) []appv1.EnvVar {
		return []appv1.EnvVar{{Name: "GREETING", Value: "hola"}}
	}, "ana", "Set GREETING", &out)
	if err != nil || n != 2 || f.count("release") != 2 || !strings.Contains(out.String(), "migrating hola") {
		t.Fatalf("config: %d %v %d %q", n, err, f.count("release"), out.String())
	}
	// A rollback does not run it.
	if _, err := r.Rollback(ctx, "hello", 1, "ana"); err != nil || f.count("release") != 2 {
		t.Fatalf("rollback: %v, %d runs", err, f.count("release"))
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Scripts == nil || app.Spec.Scripts.Release[0] != "./migrate" {
		t.Fatalf("scripts %+v", app.Spec.Scripts)
	}
}

func TestFailingReleaseCommandRecordsAFailedReleaseAndKeepsTheApp(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{}
	r.OneOffs = f
	ctx := context.Background()
	if _, err := r.Record(ctx, "hello", push(digestA, nil, nil, nil)); err != nil {
		t.Fatal(err)
	}
	f.exit = 3
	var out bytes.Buffer
	_, err := r.Record(ctx, "hello", push(digestB, &appv1.Scripts{Release: []string{"./migrate"}}, nil, &out))
	var rce *releases.ReleaseCommandError
	if !errors.As(err, &rce) || !errors.Is(err, releases.ErrReleaseCommandFailed) || rce.Release != 2 ||
		!strings.Contains(err.Error(), "release command exited with status 3") {
		t.Fatalf("Record = %v", err)
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Release != 1 || app.Spec.Image != "bex.local/hello@"+digestA || app.Spec.Scripts != nil {
		t.Fatalf("the App moved: %+v", app.Spec)
	}
	rels, _ := r.List(ctx, "hello")
	if len(rels) != 2 || rels[0].Spec.Number != 2 || rels[0].Annotations[appv1.AnnotationReleaseFailed] != "release command exited with status 3" {
		t.Fatalf("releases %+v", rels)
	}
	// config:set fails the same way; numbers keep increasing.
	_, err = r.RecordConfig(ctx, "hello", func(env []appv1.EnvVar) []appv1.EnvVar { return env }, "ana", "x", nil)
	if err != nil {
		t.Fatalf("v1 has no release command, config:set: %v", err)
	}
	f.exit = 0
	if n, err := r.Record(ctx, "hello", push(digestB, &appv1.Scripts{Release: []string{"./migrate"}}, nil, nil)); err != nil || n != 4 {
		t.Fatalf("Record = %d, %v", n, err)
	}
	f.exit = 1
	if _, err := r.RecordConfig(ctx, "hello", func(env []appv1.EnvVar) []appv1.EnvVar { return nil }, "ana", "x", nil); !errors.Is(err, releases.ErrReleaseCommandFailed) {
		t.Fatalf("config:set with a failing release command: %v", err)
	}
	if app := getApp(t, c, r.Namespace); app.Spec.Release != 4 || len(app.Spec.Env) != 1 {
		t.Fatalf("config changed: %+v", app.Spec)
	}
}

func TestAppJSONFormationAndHealthCheckYieldToTheAPI(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	hc := &appv1.HealthCheck{Path: "/health", TimeoutSeconds: 5, BootTimeoutSeconds: 30}
	aj := &releases.AppJSON{Formation: map[string]int32{"web": 2, "worker": 2}, HealthCheck: hc}
	if _, err := r.Record(ctx, "hello", push(digestA, nil, aj, nil)); err != nil {
		t.Fatal(err)
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Processes["web"].Replicas != 2 || app.Spec.Processes["worker"].Replicas != 2 || app.Spec.HealthCheck == nil ||
		app.Spec.HealthCheck.Path != "/health" || app.Annotations[appv1.AnnotationAppJSON] == "" {
		t.Fatalf("spec %+v annotations %v", app.Spec, app.Annotations)
	}
	// ps:scale worker=5 and a health check set through the API.
	p := app.Spec.Processes["worker"]
	p.Replicas = 5
	app.Spec.Processes["worker"] = p
	app.Spec.HealthCheck = &appv1.HealthCheck{Path: "/ready"}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	aj = &releases.AppJSON{Formation: map[string]int32{"web": 3, "worker": 2}, HealthCheck: &appv1.HealthCheck{Path: "/h2"}}
	if _, err := r.Record(ctx, "hello", push(digestB, nil, aj, nil)); err != nil {
		t.Fatal(err)
	}
	app = getApp(t, c, r.Namespace)
	if app.Spec.Processes["web"].Replicas != 3 || app.Spec.Processes["worker"].Replicas != 5 || app.Spec.HealthCheck.Path != "/ready" {
		t.Fatalf("after the second push: %+v %+v", app.Spec.Processes, app.Spec.HealthCheck)
	}
	// A push without app.json changes neither, and forgets what app.json set.
	if _, err := r.Record(ctx, "hello", push(digestA, nil, &releases.AppJSON{}, nil)); err != nil {
		t.Fatal(err)
	}
	app = getApp(t, c, r.Namespace)
	if app.Spec.Processes["web"].Replicas != 3 || app.Spec.Processes["worker"].Replicas != 5 || app.Annotations[appv1.AnnotationAppJSON] != "" {
		t.Fatalf("after a push without app.json: %+v %v", app.Spec.Processes, app.Annotations)
	}
}

func TestCronAndScriptsComeWithTheCodeAndRollBack(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	job := appv1.CronJob{ID: appv1.CronJobID("@daily", "./report"), Command: "./report", Schedule: "@daily"}
	ch := push(digestA, &appv1.Scripts{Postdeploy: []string{"./warm"}}, nil, nil)
	ch.Code.Cron = []appv1.CronJob{job}
	if _, err := r.Record(ctx, "hello", ch); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Record(ctx, "hello", push(digestB, nil, nil, nil)); err != nil {
		t.Fatal(err)
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Cron != nil || app.Spec.Scripts != nil {
		t.Fatalf("absent cron and scripts stay: %+v %+v", app.Spec.Cron, app.Spec.Scripts)
	}
	if _, err := r.Rollback(ctx, "hello", 1, "ana"); err != nil {
		t.Fatal(err)
	}
	app = getApp(t, c, r.Namespace)
	if len(app.Spec.Cron) != 1 || app.Spec.Cron[0] != job || app.Spec.Scripts == nil || app.Spec.Scripts.Postdeploy[0] != "./warm" {
		t.Fatalf("rollback: %+v %+v", app.Spec.Cron, app.Spec.Scripts)
	}
	rels, _ := r.List(ctx, "hello")
	if len(rels[2].Spec.Config.Cron) != 1 || rels[1].Spec.Config.Cron != nil {
		t.Fatalf("snapshots: %+v / %+v", rels[2].Spec.Config, rels[1].Spec.Config)
	}
}

// serve plays the deployer: release n serves, healthy.
func serve(t *testing.T, c client.Client, ns string, n int64) {
	t.Helper()
	if err := updateStatus(c, ns, n,
		metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason, Message: "serves"},
		metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason}); err != nil {
		t.Fatal(err)
	}
}

func TestPostdeployRunsOnceAfterTheReleaseServes(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{}
	r.OneOffs = f
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := r.Record(ctx, "hello", push(digestA, &appv1.Scripts{Postdeploy: []string{"./warm"}}, nil, nil))
	if err != nil || f.count("postdeploy") != 0 {
		t.Fatalf("Record = %d, %v; %d postdeploy runs before it serves", n, err, f.count("postdeploy"))
	}
	serve(t, c, r.Namespace, n)
	var lines []string
	url, err := r.Await(ctx, "hello", n, func(s string) { lines = append(lines, s) })
	if err != nil || url == "" {
		t.Fatalf("Await = %q, %v", url, err)
	}
	if f.count("postdeploy") != 1 || f.runs[0].Process != "postdeploy" || strings.Join(f.runs[0].Command, " ") != "./warm" {
		t.Fatalf("runs %+v", f.runs)
	}
	if all := strings.Join(lines, "\n"); !strings.Contains(all, "migrating hi") || !strings.Contains(all, "Running the postdeploy script of v1 (app.json scripts.dokku.postdeploy)") {
		t.Fatalf("progress %q", all)
	}
}

// Dokku's app-json-4.bats: a failing dokku.postdeploy fails the deploy. The
// release served while the script ran; the App goes back to the release that
// served before it, and Await returns once that one serves again.
func TestAFailingPostdeployGoesBackToTheReleaseThatServedBefore(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{}
	r.OneOffs = f
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v1, err := r.Record(ctx, "hello", push(digestA, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, c, r.Namespace, v1)
	if _, err := r.Await(ctx, "hello", v1, nil); err != nil {
		t.Fatal(err)
	}
	f.exit = 2
	v2, err := r.Record(ctx, "hello", push(digestB, &appv1.Scripts{Postdeploy: []string{"./warm"}}, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, c, r.Namespace, v2)
	var mu sync.Mutex
	var lines []string
	done := make(chan error, 1)
	go func() {
		_, err := r.Await(ctx, "hello", v2, func(s string) { mu.Lock(); lines = append(lines, s); mu.Unlock() })
		done <- err
	}()
	// The deployer's part: the App asks for v1 again, which then serves.
	testenv.Eventually(t, 10*time.Second, "the App asks for v1 again", func() error {
		if app := getApp(t, c, r.Namespace); app.Spec.Release != v1 || app.Spec.Image != "bex.local/hello@"+digestA || app.Spec.Scripts != nil {
			return fmt.Errorf("app at v%d %s, scripts %+v", app.Spec.Release, app.Spec.Image, app.Spec.Scripts)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Await returned before v1 served again: %v", err)
	default:
	}
	serve(t, c, r.Namespace, v1)
	err = <-done
	pe, ok := errors.AsType[*releases.PostdeployError](err)
	if !ok || !errors.Is(err, releases.ErrPostdeployFailed) || pe.Release != v2 || pe.Restored != v1 ||
		err.Error() != "release v2 failed: postdeploy (app.json scripts.dokku.postdeploy) exited with status 2" {
		t.Fatalf("Await = %v", err)
	}
	mu.Lock()
	all := strings.Join(lines, "\n")
	mu.Unlock()
	for _, want := range []string{"migrating hi", "postdeploy (app.json scripts.dokku.postdeploy) exited with status 2", "Going back to v1, which served before v2", "v1 serves again"} {
		if !strings.Contains(all, want) {
			t.Errorf("progress lacks %q:\n%s", want, all)
		}
	}
	rels, _ := r.List(ctx, "hello")
	if rels[0].Spec.Number != v2 || rels[0].Annotations[releases.AnnotationFailed] != pe.Reason {
		t.Fatalf("v2 not recorded as failed: %+v", rels[0].Annotations)
	}

	// A first release has nothing to go back to: it is recorded as failed, the
	// error says so, and it serves on.
	r2, c2 := setup(t)
	r2.OneOffs = f
	n, err := r2.Record(ctx, "hello", push(digestB, &appv1.Scripts{Postdeploy: []string{"./warm"}}, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, c2, r2.Namespace, n)
	lines = nil
	_, err = r2.Await(ctx, "hello", n, func(s string) { lines = append(lines, s) })
	if pe, ok := errors.AsType[*releases.PostdeployError](err); !ok || pe.Restored != 0 || pe.Release != n {
		t.Fatalf("first release: %v", err)
	}
	if app := getApp(t, c2, r2.Namespace); app.Spec.Release != n || !strings.Contains(strings.Join(lines, "\n"), "No release of hello served before v1: v1 serves on") {
		t.Fatalf("first release: app at v%d, progress %q", app.Spec.Release, lines)
	}
}

// Heroku's scripts.postdeploy runs after the first release that serves, and
// after later ones until it has succeeded once; never on an App whose first
// deploy came before it.
func TestFirstPostdeployRunsUntilItSucceedsOnce(t *testing.T) {
	r, c := setup(t)
	f := &fakeOneOffs{exit: 1}
	r.OneOffs = f
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seed := &appv1.Scripts{FirstPostdeploy: []string{"./seed"}}
	deploy := func() (string, error) {
		t.Helper()
		n, err := r.Record(ctx, "hello", push(digestA, seed, nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		serve(t, c, r.Namespace, n)
		var lines []string
		_, err = r.Await(ctx, "hello", n, func(s string) { lines = append(lines, s) })
		return strings.Join(lines, "\n"), err
	}
	out, err := deploy()
	if err != nil || f.count("postdeploy") != 1 || strings.Join(f.runs[0].Command, " ") != "./seed" ||
		!strings.Contains(out, "postdeploy (app.json scripts.postdeploy) exited with status 1: v1 serves all the same; it runs again after the next deploy, until it succeeds once") {
		t.Fatalf("v1: %v, %d runs, %q", err, f.count("postdeploy"), out)
	}
	if a := getApp(t, c, r.Namespace).Annotations[appv1.AnnotationFirstPostdeploy]; a != "pending" {
		t.Fatalf("after a failure: %q", a)
	}
	f.exit = 0
	if _, err := deploy(); err != nil || f.count("postdeploy") != 2 {
		t.Fatalf("v2: %v, %d runs", err, f.count("postdeploy"))
	}
	if a := getApp(t, c, r.Namespace).Annotations[appv1.AnnotationFirstPostdeploy]; a != "v2" {
		t.Fatalf("after it succeeded: %q", a)
	}
	if _, err := deploy(); err != nil || f.count("postdeploy") != 2 {
		t.Fatalf("v3 ran it again: %v, %d runs", err, f.count("postdeploy"))
	}

	// An App that served before app.json had the script had its first deploy.
	r2, c2 := setup(t)
	f2 := &fakeOneOffs{}
	r2.OneOffs = f2
	v1, _ := r2.Record(ctx, "hello", push(digestA, nil, nil, nil))
	serve(t, c2, r2.Namespace, v1)
	v2, _ := r2.Record(ctx, "hello", push(digestB, seed, nil, nil))
	serve(t, c2, r2.Namespace, v2)
	if _, err := r2.Await(ctx, "hello", v2, nil); err != nil || f2.count("postdeploy") != 0 {
		t.Fatalf("an older App ran it: %v, %d runs", err, f2.count("postdeploy"))
	}
}

// A release whose app.json brought a health check that never passes is
// withdrawn with its check: the App goes back to the check (and the app.json
// record) it had, so the next config change does not roll the failing check out
// again. A check set through the API after the release is left alone.
func TestRevertTakesBackTheHealthCheckTheReleaseBrought(t *testing.T) {
	r, c := setup(t)
	ctx := context.Background()
	good := &appv1.HealthCheck{Path: "/up"}
	v1, err := r.Record(ctx, "hello", push(digestA, nil, &releases.AppJSON{HealthCheck: good}, nil))
	if err != nil {
		t.Fatal(err)
	}
	setStatus(t, c, r.Namespace, v1)
	before := getApp(t, c, r.Namespace).Annotations[appv1.AnnotationAppJSON]
	bad := &appv1.HealthCheck{Path: "/never"}
	v2, err := r.Record(ctx, "hello", push(digestB, nil, &releases.AppJSON{HealthCheck: bad}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if hc := getApp(t, c, r.Namespace).Spec.HealthCheck; hc == nil || hc.Path != "/never" {
		t.Fatalf("check of v2: %+v", hc)
	}
	if err := r.Revert(ctx, "hello", v2, "web.1 did not answer GET /never"); err != nil {
		t.Fatal(err)
	}
	app := getApp(t, c, r.Namespace)
	if app.Spec.Release != v1 || app.Spec.HealthCheck == nil || app.Spec.HealthCheck.Path != "/up" || app.Annotations[appv1.AnnotationAppJSON] != before {
		t.Fatalf("after the revert: release %d check %+v app.json %q (want %q)", app.Spec.Release, app.Spec.HealthCheck, app.Annotations[appv1.AnnotationAppJSON], before)
	}

	// v3 brings /never again; the API sets /ready before it is withdrawn.
	v3, err := r.Record(ctx, "hello", push(digestB, nil, &releases.AppJSON{HealthCheck: bad}, nil))
	if err != nil {
		t.Fatal(err)
	}
	app = getApp(t, c, r.Namespace)
	app.Spec.HealthCheck = &appv1.HealthCheck{Path: "/ready"}
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	if err := r.Revert(ctx, "hello", v3, "failed"); err != nil {
		t.Fatal(err)
	}
	if hc := getApp(t, c, r.Namespace).Spec.HealthCheck; hc == nil || hc.Path != "/ready" {
		t.Fatalf("a check set through the API was replaced by the revert: %+v", hc)
	}
}
