package releases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// LabelApp labels each Release with its App's name, for listing.
const LabelApp = appv1.LabelApp

// Recorder writes releases through a Kubernetes client.
type Recorder struct {
	Client client.Client
	// Reader, when set, is used for reads instead of Client: a controller gives its
	// uncached reader, so that numbering never works from a stale cache.
	Reader    client.Reader
	Namespace string
	// PollInterval is how often Wait reads the App's status.
	PollInterval time.Duration
	// OneOffs runs the release command and the postdeploy script (release.go);
	// nil fails a release that has a release command.
	OneOffs runtime.OneOffs
}

// Change is what a new release changes.
type Change struct {
	// Image, when not empty, is the new digest-pinned image.
	Image string
	// Commit is the git commit the image was built from.
	Commit string
	// Processes, when not nil, replaces the process types; commands are kept from
	// the image when a type has none, and replicas default to 1 for web, 0 for
	// others on the first release (as Heroku scales a new app).
	Processes map[string][]string
	// CommandsOf, when not nil, sets each process type's command and keeps its
	// scale (a rollback brings back the old commands, not the old scale).
	CommandsOf map[string]appv1.ProcessSpec
	// Env, when SetEnv, replaces the config vars.
	Env    []appv1.EnvVar
	SetEnv bool
	// EditEnv, when not nil, computes the config vars from the App's current ones.
	// It runs on every attempt, on the App as just read, so that two changes made at
	// once both land (config:set A and config:set B); Env would replace one with the
	// other. An error from it ends Record with that error.
	EditEnv func(current []appv1.EnvVar) ([]appv1.EnvVar, error)
	Cause   appv1.ReleaseCause
	Actor   string
	// Description is one line for people; a default is made from the change.
	Description string
	// RollbackOf is the release brought back, for cause Rollback.
	RollbackOf int64
	// Delivery is the webhook delivery that caused the release, for cause Webhook.
	Delivery string
	// Code, when not nil, replaces the App's scripts and cron jobs with the ones
	// of the code released (a push's commit, a rollback's release): they come with
	// the code, and absent ones are removed.
	Code *Code
	// AppJSON, when not nil, is what the pushed commit's app.json set (empty when
	// it has none), applied with the last-applied rule (applyAppJSON).
	AppJSON *AppJSON
	// Progress, when not nil, receives the release command's output.
	Progress io.Writer
	// FirstEnv, on the App's first deploy only, are set where the App does not
	// set them (app.json's env, env.go): a value already set is never replaced.
	FirstEnv []EnvDefault
}

// Code is what comes with the code besides its image and commands.
type Code struct {
	Scripts *appv1.Scripts
	Cron    []appv1.CronJob
}

// AppJSON is what an app.json set that the API can change too: the scale of each
// process type and the web health check.
type AppJSON struct {
	Formation   map[string]int32   `json:"formation,omitempty"`
	HealthCheck *appv1.HealthCheck `json:"healthCheck,omitempty"`
}

// Record creates the next Release of app and points the App at it. It returns the
// release number. It retries when another writer takes the number or updates the
// App in between.
func (r *Recorder) Record(ctx context.Context, app string, ch Change) (int64, error) {
	var err error
	if ch.FirstEnv, err = withSecrets(ch.FirstEnv); err != nil {
		return 0, err
	}
	if runsReleasePhase(ch.Cause) {
		if err := r.releasePhase(ctx, app, ch); err != nil {
			return 0, err
		}
	}
	for attempt := 0; attempt < 10; attempt++ {
		n, err := r.record(ctx, app, ch)
		if err == nil {
			return n, nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return 0, err
		}
		// Someone else wrote the App in between (the deployer's status, another
		// release): read it again after a short, growing pause.
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("app %s changed too often while its release was recorded: try again", app)
}

func (r *Recorder) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

func (r *Recorder) record(ctx context.Context, name string, ch Change) (int64, error) {
	var before *appv1.App
	app, spec, n, err := r.prepare(ctx, name, ch, &before)
	if err != nil {
		return 0, err
	}
	rel, err := r.newRelease(app, spec, n, ch)
	if err != nil {
		return 0, err
	}
	if err := keepBefore(rel, before, spec.HealthCheck); err != nil {
		return 0, err
	}
	// The release that serves now is the one a failing postdeploy script goes
	// back to.
	rel.Annotations[appv1.AnnotationServedBefore] = strconv.FormatInt(before.Status.Revision, 10)
	if err := r.Client.Create(ctx, rel); err != nil {
		return 0, err
	}
	app.Spec = *spec
	// Update carries the resourceVersion read above: a concurrent change of the App
	// is a conflict, not lost. The Release just created is then removed again, so
	// that the retry can take its number.
	if err := r.Client.Update(ctx, app); err != nil {
		if derr := r.Client.Delete(ctx, rel); derr != nil && !apierrors.IsNotFound(derr) {
			return 0, errors.Join(err, derr)
		}
		return 0, err
	}
	return n, nil
}

// prepare reads the App and computes its next spec and release number; the
// App's annotations are changed in place (app.json's last-applied record).
func (r *Recorder) prepare(ctx context.Context, name string, ch Change, before ...**appv1.App) (*appv1.App, *appv1.AppSpec, int64, error) {
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return nil, nil, 0, fmt.Errorf("app %s: %w", name, err)
	}
	for _, b := range before {
		*b = app.DeepCopy()
	}
	// The next number follows both the App and the Releases that exist, so that a
	// Release left by an attempt that could not finish never blocks the count.
	n := app.Spec.Release + 1
	existing, err := r.List(ctx, name)
	if err != nil {
		return nil, nil, 0, err
	}
	if len(existing) > 0 && existing[0].Spec.Number >= n {
		n = existing[0].Spec.Number + 1
	}
	spec := app.Spec.DeepCopy()
	spec.Release = n
	if ch.Image != "" {
		spec.Image = ch.Image
	}
	if ch.Processes != nil {
		spec.Processes = mergeProcesses(app.Spec.Processes, ch.Processes)
	}
	if ch.CommandsOf != nil {
		spec.Processes = withScaleOf(ch.CommandsOf, app.Spec.Processes)
	}
	if ch.SetEnv {
		spec.Env = ch.Env
	}
	if ch.EditEnv != nil {
		env, err := ch.EditEnv(slices.Clone(app.Spec.Env))
		if err != nil {
			return nil, nil, 0, err
		}
		spec.Env = env
	}
	if len(ch.FirstEnv) > 0 && firstDeploy(app) {
		spec.Env, _ = applyEnvDefaults(spec.Env, ch.FirstEnv)
	}
	if len(spec.Processes) == 0 && ch.Image != "" {
		// The first image of an app without a Procfile: it runs its own command as
		// web, as Heroku and Dokku run a Dockerfile's CMD.
		spec.Processes = mergeProcesses(nil, nil)
	}
	if ch.Code != nil {
		spec.Scripts = codeScripts(ch.Code.Scripts, app.Spec.Scripts)
		spec.Cron = slices.Clone(ch.Code.Cron)
	}
	if ch.AppJSON != nil {
		if err := applyAppJSON(app, spec, ch.AppJSON); err != nil {
			return nil, nil, 0, err
		}
	}
	if spec.Image == "" {
		return nil, nil, 0, fmt.Errorf("app %s has no image yet: push code first", name)
	}
	return app, spec, n, nil
}

// newRelease is the Release object of release n with spec.
func (r *Recorder) newRelease(app *appv1.App, spec *appv1.AppSpec, n int64, ch Change) (*appv1.Release, error) {
	name := app.Name
	rel := &appv1.Release{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s-v%d", name, n),
			Namespace: r.Namespace,
			Labels:    map[string]string{LabelApp: name},
		},
		Spec: appv1.ReleaseSpec{
			App:    name,
			Number: n,
			Image:  spec.Image,
			Commit: ch.Commit,
			Config: appv1.ReleaseConfig{Env: spec.Env, Processes: spec.Processes,
				Scripts: spec.Scripts.DeepCopy(), Cron: slices.Clone(spec.Cron)},
			Cause:       ch.Cause,
			Actor:       ch.Actor,
			Description: ch.Description,
			RollbackOf:  ch.RollbackOf,
			Delivery:    ch.Delivery,
		},
	}
	if rel.Spec.Description == "" {
		rel.Spec.Description = describe(ch)
	}
	if err := controllerutil.SetControllerReference(app, rel, r.Client.Scheme()); err != nil {
		return nil, err
	}
	return rel, nil
}

func mergeProcesses(old map[string]appv1.ProcessSpec, found map[string][]string) map[string]appv1.ProcessSpec {
	out := make(map[string]appv1.ProcessSpec, len(found))
	for name, cmd := range found {
		p, existed := old[name]
		p.Command = cmd
		if !existed && name == "web" {
			p.Replicas = 1
		}
		out[name] = p
	}
	if len(out) == 0 {
		// An image without a Procfile runs its own command as web.
		out["web"] = appv1.ProcessSpec{Replicas: 1}
		if p, ok := old["web"]; ok {
			out["web"] = appv1.ProcessSpec{Replicas: p.Replicas}
		}
	}
	return out
}

func describe(ch Change) string {
	switch {
	case ch.Cause == appv1.ReleaseCauseRollback:
		return fmt.Sprintf("Rollback to v%d", ch.RollbackOf)
	case len(ch.Commit) >= 7 && ch.Image != "":
		return "Deploy " + ch.Commit[:7]
	case ch.Image != "":
		return "Deploy " + ch.Image
	}
	return string(ch.Cause)
}

// RecordConfig records a release of app whose config vars are edit of the
// current ones (cause Config), by actor.
// The release command, when the App has one, runs first with the new config, its
// output going to progress (nil: discarded); its failure records a failed release
// and changes nothing else (a *ReleaseCommandError).
func (r *Recorder) RecordConfig(ctx context.Context, app string, edit func([]appv1.EnvVar) []appv1.EnvVar, actor, description string, progress io.Writer) (int64, error) {
	return r.Record(ctx, app, Change{
		EditEnv: func(env []appv1.EnvVar) ([]appv1.EnvVar, error) { return edit(env), nil },
		Cause:   appv1.ReleaseCauseConfig, Actor: actor, Description: description, Progress: progress,
	})
}

// Rollback records a new release that runs the image, commands and config vars of
// release `to`, keeping the current scale, as Heroku's rollback does. The history
// only grows: the old release stays as it was.
func (r *Recorder) Rollback(ctx context.Context, app string, to int64, actor string) (int64, error) {
	old := &appv1.Release{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", app, to)}, old); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("app %s has no release v%d to roll back to (old releases are pruned)", app, to)
		}
		return 0, err
	}
	return r.Record(ctx, app, Change{
		Image: old.Spec.Image, Commit: old.Spec.Commit, CommandsOf: old.Spec.Config.Processes,
		Env: old.Spec.Config.Env, SetEnv: true, Cause: appv1.ReleaseCauseRollback, Actor: actor, RollbackOf: to,
		Code: &Code{Scripts: old.Spec.Config.Scripts, Cron: old.Spec.Config.Cron},
	})
}

// ErrRolloutFailed is matched (errors.Is) by every *RolloutError.
var ErrRolloutFailed = errors.New("rollout failed")

// RolloutError says why release Release did not come to serve: Reason is the
// deployer's message (the RolledOut condition's), as data, so that no caller
// parses it out of an error's text.
type RolloutError struct {
	Release int64
	Reason  string
	// Serving is the release the deployer said keeps serving (the App's
	// status.revision, written with the condition whose message ends "Release
	// vN keeps serving."); 0 when it named none.
	Serving int64
}

func (e *RolloutError) Error() string { return ErrRolloutFailed.Error() + ": " + e.Reason }

// Is makes errors.Is(err, ErrRolloutFailed) hold.
func (e *RolloutError) Is(target error) bool { return target == ErrRolloutFailed }

// RolloutFailure is the reason, for callers that declare the error they read
// as an interface (the gitserver's backend).
func (e *RolloutError) RolloutFailure() string { return e.Reason }

// KeepsServing is Serving, for callers that declare the error they read as an
// interface (the gitserver's backend, through its pipeline).
func (e *RolloutError) KeepsServing() int64 { return e.Serving }

// Wait waits until release n of app serves: status.revision is n and the Ready
// condition is true for the current generation. It returns status.url. It fails
// with ErrRolloutFailed and the RolledOut condition's message when the deployer
// reports that release n failed, and with ctx's error when ctx ends first. progress
// receives a line whenever the condition's message changes.
//
// With a Client that watches (client.WithWatch), it reads the App once and then
// follows its changes from that read's resourceVersion, so the moment the deployer
// writes the status is the moment Wait returns: a push is waiting on it. Without
// one, or while a watch cannot be opened, it reads the App every PollInterval.
func (r *Recorder) Wait(ctx context.Context, name string, n int64, progress func(string)) (string, error) {
	interval := r.PollInterval
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	w := waiter{name: name, n: n, progress: progress}
	watcher, watches := r.Client.(client.WithWatch)
	var readErr error
	for {
		app := &appv1.App{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
			if ctx.Err() != nil {
				// The client's own error need not wrap the context's (a rate
				// limiter's "would exceed context deadline" does not), and a
				// caller tells a timeout from a failure by the context's.
				return "", fmt.Errorf("%w (reading app %s: %v)", ctx.Err(), name, err)
			}
			if apierrors.IsNotFound(err) {
				return "", fmt.Errorf("app %s: %w", name, err)
			}
			// A transient error (the API server restarting, the client's rate
			// limiter) ends nothing: the rollout goes on, and the pusher's ref
			// should follow what it does. Read again until ctx ends.
			readErr = err
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("%w (last read of app %s: %v)", ctx.Err(), name, readErr)
			case <-time.After(interval):
			}
			continue
		}
		if url, done, err := w.judge(app); done {
			return url, err
		}
		if watches {
			url, done, err := w.follow(ctx, watcher, app)
			if done {
				return url, err
			}
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			// The watch ended (a timeout of the API server's, a restart): read
			// again and follow from there, or poll when it cannot be opened.
			if err == nil {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(interval):
		}
	}
}

// waiter is one Wait's judgement of the App as it changes.
type waiter struct {
	name     string
	n        int64
	progress func(string)
	last     string // the last message given to progress
}

// judge says whether app ends the wait, with Wait's result, and gives the
// RolledOut condition's message to progress when it changed.
func (w *waiter) judge(app *appv1.App) (url string, done bool, err error) {
	if app.Spec.Release > w.n {
		return "", true, &RolloutError{Release: w.n, Reason: fmt.Sprintf("release v%d was replaced by v%d before it served", w.n, app.Spec.Release)}
	}
	current := app.Status.ObservedGeneration >= app.Generation
	ready := meta.FindStatusCondition(app.Status.Conditions, appv1.ReadyCondition)
	rolled := meta.FindStatusCondition(app.Status.Conditions, appv1.RolledOutCondition)
	if current && app.Status.Revision == w.n && ready != nil && ready.Status == metav1.ConditionTrue {
		return app.Status.URL, true, nil
	}
	if current && rolled != nil && rolled.Status == metav1.ConditionFalse && rolled.Reason != appv1.RollingOutReason {
		return "", true, &RolloutError{Release: w.n, Reason: rolled.Message, Serving: app.Status.Revision}
	}
	// Only what the deployer said about this generation: an older message (such
	// as "nothing is deployed yet" before a first release) is not progress.
	if current && rolled != nil && rolled.Message != w.last && w.progress != nil {
		w.last = rolled.Message
		w.progress(rolled.Message)
	}
	return "", false, nil
}

// follow watches the App from the version read (from) until judge ends the
// wait (done), the watch ends (nil error: read again) or cannot be opened (its
// error: poll instead).
func (w *waiter) follow(ctx context.Context, c client.WithWatch, from *appv1.App) (url string, done bool, err error) {
	list := &appv1.AppList{}
	events, err := c.Watch(ctx, list, client.InNamespace(from.Namespace),
		client.MatchingFields{"metadata.name": w.name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: from.ResourceVersion}})
	if err != nil {
		return "", false, err
	}
	defer events.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", false, nil
		case ev, ok := <-events.ResultChan():
			if !ok {
				return "", false, nil
			}
			app, isApp := ev.Object.(*appv1.App)
			if !isApp {
				// An error event (the version read is too old): read again,
				// after PollInterval, so a watch that keeps failing is not
				// opened in a loop.
				return "", false, fmt.Errorf("watching app %s: %v", w.name, ev.Object)
			}
			if app.Name != w.name {
				continue // the field selector is the server's to apply; not trusted alone
			}
			if ev.Type == watch.Deleted {
				return "", true, fmt.Errorf("app %s: %w", w.name, apierrors.NewNotFound(appv1.GroupVersion.WithResource("apps").GroupResource(), w.name))
			}
			if url, done, err := w.judge(app); done {
				return url, true, err
			}
		}
	}
}

// Serving returns the number of the release of app that serves (its
// status.revision), 0 when none has served yet.
func (r *Recorder) Serving(ctx context.Context, name string) (int64, error) {
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return 0, fmt.Errorf("app %s: %w", name, err)
	}
	return app.Status.Revision, nil
}

// List returns app's releases, newest first.
func (r *Recorder) List(ctx context.Context, app string) ([]appv1.Release, error) {
	var list appv1.ReleaseList
	if err := r.reader().List(ctx, &list, client.InNamespace(r.Namespace), client.MatchingLabels{LabelApp: app}); err != nil {
		return nil, err
	}
	items := list.Items
	sort.Slice(items, func(i, j int) bool { return items[i].Spec.Number > items[j].Spec.Number })
	return items, nil
}

// Await is Wait for the one who recorded release n: when the rollout fails, the
// release is withdrawn (Revert) before the failure is returned, so the App goes back
// to the release that serves. When it serves, its postdeploy script runs once
// (push, webhook and deploy releases), its output going to progress; when that
// fails, the App goes back to the release that served before n, and Await
// returns a *PostdeployError once that one serves again. Then the first
// deploy's postdeploy script runs, if n is the first release that served.
func (r *Recorder) Await(ctx context.Context, name string, n int64, progress func(string)) (string, error) {
	url, err := r.Wait(ctx, name, n, progress)
	// Release n, read once for both scripts. Without OneOffs no script runs;
	// a release that cannot be read runs none either.
	rel := &appv1.Release{}
	if err == nil && r.OneOffs != nil && r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", name, n)}, rel) == nil {
		if err := r.postdeploy(ctx, name, n, rel, progress); err != nil {
			return "", err
		}
		r.firstPostdeploy(ctx, name, n, rel, progress)
	}
	var failed *RolloutError
	if errors.As(err, &failed) {
		if rerr := r.Revert(context.WithoutCancel(ctx), name, n, failed.Reason); rerr != nil {
			return "", errors.Join(err, fmt.Errorf("withdrawing release v%d: %w", n, rerr))
		}
	}
	return url, err
}

// AnnotationFailed marks a Release that never served, with the reason; `releases`
// listings show it.
const AnnotationFailed = appv1.AnnotationReleaseFailed

// Revert withdraws release n of app after its rollout failed: the App goes back to
// the image, commands and config vars of the release that serves (status.revision),
// keeping the current scale, and Release n is annotated with why. Without it the App
// would keep asking for the failed release, and the next start of the deployer (which
// remembers failures in memory only) would try it again in place of the one that
// served. It does nothing when the App has moved past n meanwhile, or when nothing
// served before n (a first release that fails has nothing to go back to).
func (r *Recorder) Revert(ctx context.Context, name string, n int64, reason string) error {
	for attempt := 0; ; attempt++ {
		err := r.revert(ctx, name, n, reason)
		if !apierrors.IsConflict(err) || attempt == 4 {
			return err
		}
	}
}

func (r *Recorder) revert(ctx context.Context, name string, n int64, reason string) error {
	rel := &appv1.Release{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", name, n)}, rel); err == nil {
		if err := r.markFailed(ctx, rel, reason); err != nil {
			return err
		}
	}
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return fmt.Errorf("app %s: %w", name, err)
	}
	serving := app.Status.Revision
	if app.Spec.Release != n || serving == 0 || serving == n {
		return nil
	}
	return r.restore(ctx, app, rel, serving)
}

// markFailed annotates rel with why it failed, once.
func (r *Recorder) markFailed(ctx context.Context, rel *appv1.Release, reason string) error {
	if rel.Annotations[AnnotationFailed] != "" {
		return nil
	}
	patch := client.MergeFrom(rel.DeepCopy())
	if rel.Annotations == nil {
		rel.Annotations = map[string]string{}
	}
	rel.Annotations[AnnotationFailed] = reason
	if err := r.Client.Patch(ctx, rel, patch); err != nil {
		return fmt.Errorf("mark release v%d failed: %w", rel.Spec.Number, err)
	}
	return nil
}

// restore points app, which asks for failed, back at release to: its image,
// commands, config vars, scripts and cron jobs, the current scale kept.
func (r *Recorder) restore(ctx context.Context, app *appv1.App, failed *appv1.Release, to int64) error {
	good := &appv1.Release{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", app.Name, to)}, good); err != nil {
		return fmt.Errorf("release v%d of %s: %w", to, app.Name, err)
	}
	restoreBefore(app, failed)
	app.Spec.Release = to
	app.Spec.Image = good.Spec.Image
	app.Spec.Env = good.Spec.Config.Env
	app.Spec.Scripts = codeScripts(good.Spec.Config.Scripts, app.Spec.Scripts)
	app.Spec.Cron = slices.Clone(good.Spec.Config.Cron)
	app.Spec.Processes = withScaleOf(good.Spec.Config.Processes, app.Spec.Processes)
	return r.Client.Update(ctx, app)
}

// withdraw records release n as failed and points the App back at release to,
// which served before n did: n's postdeploy script failed after n came to
// serve. It does nothing to the App when it has moved past n meanwhile.
func (r *Recorder) withdraw(ctx context.Context, name string, n, to int64, reason string) error {
	for attempt := 0; ; attempt++ {
		err := r.withdrawOnce(ctx, name, n, to, reason)
		if !apierrors.IsConflict(err) || attempt == 4 {
			return err
		}
	}
}

func (r *Recorder) withdrawOnce(ctx context.Context, name string, n, to int64, reason string) error {
	rel := &appv1.Release{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", name, n)}, rel); err != nil {
		return err
	}
	if err := r.markFailed(ctx, rel, reason); err != nil {
		return err
	}
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return fmt.Errorf("app %s: %w", name, err)
	}
	if app.Spec.Release != n {
		return nil
	}
	return r.restore(ctx, app, rel, to)
}

// annotationBefore on a Release keeps what the App's health check and app.json
// record were before the release changed them (JSON of beforeRelease), so that
// withdrawing a release that failed (a check app.json brought that never
// passes) puts them back: the check is not in the Releases' snapshots, since a
// check set through the API makes no release.
const annotationBefore = "app.bex.co/before"

type beforeRelease struct {
	HealthCheck *appv1.HealthCheck `json:"healthCheck,omitempty"`
	AppJSON     string             `json:"appJSON,omitempty"`
	// After is the check the release set, to tell whether the App still has it.
	After *appv1.HealthCheck `json:"after,omitempty"`
}

// keepBefore records on rel what before had and the check it sets (after).
func keepBefore(rel *appv1.Release, before *appv1.App, after *appv1.HealthCheck) error {
	if before == nil {
		return nil
	}
	b := beforeRelease{HealthCheck: before.Spec.HealthCheck, AppJSON: before.Annotations[appv1.AnnotationAppJSON], After: after}
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if rel.Annotations == nil {
		rel.Annotations = map[string]string{}
	}
	rel.Annotations[annotationBefore] = string(data)
	return nil
}

// restoreBefore puts back the health check and app.json record failed had
// replaced, when the App still has what failed set (a check set through the API
// since is left alone).
func restoreBefore(app *appv1.App, failed *appv1.Release) {
	var b beforeRelease
	if failed == nil || json.Unmarshal([]byte(failed.Annotations[annotationBefore]), &b) != nil {
		return
	}
	if !equalCheck(app.Spec.HealthCheck, b.After) {
		return
	}
	app.Spec.HealthCheck = b.HealthCheck.DeepCopy()
	if b.AppJSON == "" {
		delete(app.Annotations, appv1.AnnotationAppJSON)
	} else {
		if app.Annotations == nil {
			app.Annotations = map[string]string{}
		}
		app.Annotations[appv1.AnnotationAppJSON] = b.AppJSON
	}
}

func equalCheck(a, b *appv1.HealthCheck) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// withScaleOf returns the process types of commands, each with the replicas and
// resources it has in current when it is there: going back to an older release
// brings back its commands, not its scale or its limits (ps:scale and
// ps:resources make no release).
func withScaleOf(commands, current map[string]appv1.ProcessSpec) map[string]appv1.ProcessSpec {
	procs := make(map[string]appv1.ProcessSpec, len(commands))
	for name, p := range commands {
		if cur, ok := current[name]; ok {
			p.Replicas = cur.Replicas
			p.Resources = cur.Resources.DeepCopy()
		}
		procs[name] = p
	}
	return procs
}
