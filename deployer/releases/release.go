package releases

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// runsReleasePhase says which causes run the release command: a new release of
// new code or new config (push, webhook, deploy, config). Not a rollback: it goes
// back to code whose migrations already ran, and it is what one reaches for when
// things are on fire, so nothing may stand in its way. Scale and restarts make no
// release.
func runsReleasePhase(c appv1.ReleaseCause) bool {
	switch c {
	case appv1.ReleaseCausePush, appv1.ReleaseCauseWebhook, appv1.ReleaseCauseDeploy, appv1.ReleaseCauseConfig:
		return true
	}
	return false
}

// ErrReleaseCommandFailed is matched (errors.Is) by every *ReleaseCommandError.
var ErrReleaseCommandFailed = errors.New("release command failed")

// ReleaseCommandError is a release whose release command failed: release Release
// is recorded with AnnotationFailed, and the App's spec did not move.
type ReleaseCommandError struct {
	Release int64
	// Reason is the annotation's text, such as "release command exited with status 3".
	Reason string
}

func (e *ReleaseCommandError) Error() string {
	return fmt.Sprintf("release v%d failed: %s", e.Release, e.Reason)
}

// Is makes errors.Is(err, ErrReleaseCommandFailed) hold.
func (e *ReleaseCommandError) Is(target error) bool { return target == ErrReleaseCommandFailed }

// ReleaseCommandFailed is the release whose command failed, for callers that
// declare the error they read as an interface (the gitserver's backend).
func (e *ReleaseCommandError) ReleaseCommandFailed() int64 { return e.Release }

// releasePhase runs the release command of the release ch makes, once, with its
// image and config, before anything is written. When it fails, release vN is
// recorded as failed and a *ReleaseCommandError returned.
func (r *Recorder) releasePhase(ctx context.Context, name string, ch Change) error {
	app, spec, n, err := r.prepare(ctx, name, ch)
	if err != nil {
		return err
	}
	if spec.Scripts == nil || len(spec.Scripts.Release) == 0 {
		return nil
	}
	if r.OneOffs == nil {
		return fmt.Errorf("app %s has a release command, and this deployer cannot run one-offs", name)
	}
	out := ch.Progress
	if out == nil {
		out = io.Discard
	}
	out = &lockedWriter{w: out}
	timeout := time.Duration(spec.Scripts.ReleaseTimeout()) * time.Second
	fmt.Fprintf(out, "-----> Running the release command of v%d\n", n)
	exit, err := r.OneOffs.Run(ctx, runtime.OneOff{
		App: app, ID: runtime.NewOneOffID(), Process: "release", Release: n, Image: spec.Image,
		Command: spec.Scripts.Release, Expand: true, Env: spec.Env, Timeout: timeout, Stdout: out, Stderr: out,
	})
	if err != nil {
		return fmt.Errorf("the release command of %s could not run: %w", name, err)
	}
	if exit == 0 {
		return nil
	}
	reason := fmt.Sprintf("release command exited with status %d", exit)
	if exit == 137 {
		reason = fmt.Sprintf("release command exited with status 137 (killed: it ran longer than %s, or out of memory)", timeout)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	n, err = r.recordFailed(context.WithoutCancel(ctx), name, ch, reason)
	if err != nil {
		return fmt.Errorf("%s, and recording the failed release: %w", reason, err)
	}
	return &ReleaseCommandError{Release: n, Reason: reason}
}

// recordFailed records the release ch makes as failed, without moving the App:
// the numbers keep increasing, and the history says what happened.
func (r *Recorder) recordFailed(ctx context.Context, name string, ch Change, reason string) (int64, error) {
	for attempt := 0; attempt < 10; attempt++ {
		app, spec, n, err := r.prepare(ctx, name, ch)
		if err != nil {
			return 0, err
		}
		rel, err := r.newRelease(app, spec, n, ch)
		if err != nil {
			return 0, err
		}
		rel.Annotations = map[string]string{AnnotationFailed: reason}
		err = r.Client.Create(ctx, rel)
		if err == nil {
			return n, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("app %s changed too often while its failed release was recorded", name)
}

// codeScripts are the scripts that come with the code, with the App's release
// timeout kept (a setting of the App, not of the code); nil when none is left.
func codeScripts(code, current *appv1.Scripts) *appv1.Scripts {
	s := code.DeepCopy()
	if s == nil {
		s = &appv1.Scripts{}
	}
	s.ReleaseTimeoutSeconds = 0
	if current != nil {
		s.ReleaseTimeoutSeconds = current.ReleaseTimeoutSeconds
	}
	if len(s.Release) == 0 && len(s.Postdeploy) == 0 && len(s.FirstPostdeploy) == 0 && s.ReleaseTimeoutSeconds == 0 {
		return nil
	}
	return s
}

// applyAppJSON applies what a push's app.json set to spec, with a last-applied
// rule (as kubectl's): the App's AnnotationAppJSON records what the last push's
// app.json set, and a value is replaced only when the App still has what app.json
// set last time, or when it was never set (a new process type, a type app.json
// did not scale before, no health check). So ps:scale and a health check set
// through the API survive later pushes, and a changed app.json still lands on an
// App nobody changed by hand. The annotation then records this push's app.json.
func applyAppJSON(app *appv1.App, spec *appv1.AppSpec, aj *AppJSON) error {
	var last AppJSON
	if v := app.Annotations[appv1.AnnotationAppJSON]; v != "" {
		// An annotation that is not ours (edited by hand) counts as nothing set.
		_ = json.Unmarshal([]byte(v), &last)
	}
	for t, q := range aj.Formation {
		p, ok := spec.Processes[t]
		if !ok {
			continue
		}
		old, existed := app.Spec.Processes[t]
		prev, had := last.Formation[t]
		if !existed || !had || old.Replicas == prev {
			p.Replicas = q
			spec.Processes[t] = p
		}
	}
	switch {
	case aj.HealthCheck != nil:
		if app.Spec.HealthCheck == nil || last.HealthCheck != nil && *app.Spec.HealthCheck == *last.HealthCheck {
			spec.HealthCheck = aj.HealthCheck.DeepCopy()
		}
	case last.HealthCheck != nil && app.Spec.HealthCheck != nil && *app.Spec.HealthCheck == *last.HealthCheck:
		// app.json no longer sets the check it set: it goes with it.
		spec.HealthCheck = nil
	}
	if len(aj.Formation) == 0 && aj.HealthCheck == nil {
		delete(app.Annotations, appv1.AnnotationAppJSON)
		return nil
	}
	rec := AppJSON{Formation: maps.Clone(aj.Formation), HealthCheck: aj.HealthCheck}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if app.Annotations == nil {
		app.Annotations = map[string]string{}
	}
	app.Annotations[appv1.AnnotationAppJSON] = string(data)
	return nil
}

// ErrPostdeployFailed is matched (errors.Is) by every *PostdeployError.
var ErrPostdeployFailed = errors.New("postdeploy failed")

// PostdeployError is a release whose postdeploy script (app.json's
// scripts.dokku.postdeploy) failed once it served: release Release is recorded
// as failed, and the App went back to release Restored (0: none had served
// before it, and Release serves on).
type PostdeployError struct {
	Release, Restored int64
	// Reason is the annotation's text, such as "postdeploy (app.json
	// scripts.dokku.postdeploy) exited with status 3".
	Reason string
}

func (e *PostdeployError) Error() string {
	return fmt.Sprintf("release v%d failed: %s", e.Release, e.Reason)
}

// Is makes errors.Is(err, ErrPostdeployFailed) hold.
func (e *PostdeployError) Is(target error) bool { return target == ErrPostdeployFailed }

// RestoredRelease is the release the App went back to, for callers that read
// the error through an interface (0: none).
func (e *PostdeployError) RestoredRelease() int64 { return e.Restored }

// runsPostdeploy says which causes run the postdeploy scripts: the ones that
// deploy code (push, webhook, deploy). A config change deploys no new code, a
// rollback goes back to code that ran them.
func runsPostdeploy(c appv1.ReleaseCause) bool {
	return runsReleasePhase(c) && c != appv1.ReleaseCauseConfig
}

// postdeploy runs release n's postdeploy script once, after it serves (push,
// webhook and deploy releases). When it fails, release n is recorded as
// failed and the App goes back to the release that served before n (the
// Release's AnnotationServedBefore), which is awaited: a *PostdeployError.
// Meanwhile n serves: the window is the script's run and the rollout back.
func (r *Recorder) postdeploy(ctx context.Context, name string, n int64, rel *appv1.Release, progress func(string)) error {
	sc := rel.Spec.Config.Scripts
	if sc == nil || len(sc.Postdeploy) == 0 || !runsPostdeploy(rel.Spec.Cause) {
		return nil
	}
	say := sayer(progress)
	say(fmt.Sprintf("Running the postdeploy script of v%d (app.json scripts.dokku.postdeploy)", n))
	reason := r.runScript(ctx, name, rel, sc.Postdeploy, "postdeploy (app.json scripts.dokku.postdeploy)", say)
	if reason == "" {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	ctx = context.WithoutCancel(ctx)
	before, _ := strconv.ParseInt(rel.Annotations[appv1.AnnotationServedBefore], 10, 64)
	say(reason)
	if before <= 0 || before == n {
		if err := r.markFailed(ctx, rel, reason); err != nil {
			return fmt.Errorf("%s, and recording the failed release: %w", reason, err)
		}
		say(fmt.Sprintf("No release of %s served before v%d: v%d serves on, push a fix", name, n, n))
		return &PostdeployError{Release: n, Reason: reason}
	}
	say(fmt.Sprintf("Going back to v%d, which served before v%d", before, n))
	if err := r.withdraw(ctx, name, n, before, reason); err != nil {
		return fmt.Errorf("%s, and going back to v%d: %w", reason, before, err)
	}
	if _, err := r.Wait(ctx, name, before, progress); err != nil {
		return fmt.Errorf("%s, and v%d did not serve again: %w", reason, before, err)
	}
	say(fmt.Sprintf("v%d serves again", before))
	return &PostdeployError{Release: n, Restored: before, Reason: reason}
}

// firstPostdeploy runs Heroku's postdeploy script (app.json's
// scripts.postdeploy) after the App's first release that serves, and after each
// later one while it has not succeeded (AnnotationFirstPostdeploy "pending").
// Its failure is reported: the release serves on, as it did on Heroku.
func (r *Recorder) firstPostdeploy(ctx context.Context, name string, n int64, rel *appv1.Release, progress func(string)) {
	sc := rel.Spec.Config.Scripts
	if sc == nil || len(sc.FirstPostdeploy) == 0 || !runsPostdeploy(rel.Spec.Cause) {
		return
	}
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return
	}
	record, before := app.Annotations[appv1.AnnotationFirstPostdeploy], rel.Annotations[appv1.AnnotationServedBefore]
	// An App that served before this release, and never ran the script, had
	// its first deploy already (before app.json had the script): it never runs.
	if record != firstPostdeployPending && (record != "" || before != "0") {
		return
	}
	say := sayer(progress)
	say(fmt.Sprintf("Running the first deploy's postdeploy script with v%d (app.json scripts.postdeploy)", n))
	reason := r.runScript(ctx, name, rel, sc.FirstPostdeploy, "postdeploy (app.json scripts.postdeploy)", say)
	value := fmt.Sprintf("v%d", n)
	if reason != "" {
		say(fmt.Sprintf("%s: v%d serves all the same; it runs again after the next deploy, until it succeeds once", reason, n))
		value = firstPostdeployPending
	}
	patch := client.MergeFrom(app.DeepCopy())
	if app.Annotations == nil {
		app.Annotations = map[string]string{}
	}
	app.Annotations[appv1.AnnotationFirstPostdeploy] = value
	if err := r.Client.Patch(context.WithoutCancel(ctx), app, patch); err != nil {
		say(fmt.Sprintf("Recording that the postdeploy script ran failed: %v", err))
	}
}

// firstPostdeployPending is AnnotationFirstPostdeploy while the script has
// not succeeded yet.
const firstPostdeployPending = "pending"

// runScript runs a script of rel in a one-off instance of it (Process
// "postdeploy"), its output as progress lines, and returns "" when it
// succeeded, else why not, naming it as what.
func (r *Recorder) runScript(ctx context.Context, name string, rel *appv1.Release, command []string, what string, say func(string)) string {
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return fmt.Sprintf("%s could not run: %v", what, err)
	}
	sc := rel.Spec.Config.Scripts
	timeout := time.Duration(sc.ReleaseTimeout()) * time.Second
	lw := &lineWriter{emit: say}
	exit, err := r.OneOffs.Run(ctx, runtime.OneOff{
		App: app, ID: runtime.NewOneOffID(), Process: "postdeploy", Release: rel.Spec.Number, Image: rel.Spec.Image,
		Command: command, Expand: true, Env: rel.Spec.Config.Env, Timeout: timeout, Stdout: lw, Stderr: lw,
	})
	lw.flush()
	switch {
	case err != nil:
		return fmt.Sprintf("%s could not run: %v", what, err)
	case exit == 137:
		return fmt.Sprintf("%s exited with status 137 (killed: it ran longer than %s, or out of memory)", what, timeout)
	case exit != 0:
		return fmt.Sprintf("%s exited with status %d", what, exit)
	}
	return ""
}

func sayer(progress func(string)) func(string) {
	if progress == nil {
		return func(string) {}
	}
	return progress
}

// lockedWriter serializes the writes of a one-off's two streams.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lineWriter turns output into lines for a progress function, each bounded.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

const maxLine = 4096

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > maxLine {
				l.emit(string(l.buf[:maxLine]))
				l.buf = slices.Clone(l.buf[maxLine:])
			}
			return len(p), nil
		}
		line := l.buf[:i]
		if len(line) > maxLine {
			line = line[:maxLine]
		}
		l.emit(string(line))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}
