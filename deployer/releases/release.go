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
	if len(s.Release) == 0 && len(s.Postdeploy) == 0 && s.ReleaseTimeoutSeconds == 0 {
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

// postdeploy runs release n's postdeploy script once, after it serves, for the
// causes that run the release phase but config (a config change deploys no new
// code). Its failure is reported on progress, not undone.
func (r *Recorder) postdeploy(ctx context.Context, name string, n int64, progress func(string)) {
	if r.OneOffs == nil {
		return
	}
	rel := &appv1.Release{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: fmt.Sprintf("%s-v%d", name, n)}, rel); err != nil {
		return
	}
	sc := rel.Spec.Config.Scripts
	if sc == nil || len(sc.Postdeploy) == 0 || !runsReleasePhase(rel.Spec.Cause) || rel.Spec.Cause == appv1.ReleaseCauseConfig {
		return
	}
	app := &appv1.App{}
	if err := r.reader().Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, app); err != nil {
		return
	}
	say := func(string) {}
	if progress != nil {
		say = progress
	}
	lw := &lineWriter{emit: say}
	say(fmt.Sprintf("Running the postdeploy script of v%d", n))
	exit, err := r.OneOffs.Run(ctx, runtime.OneOff{
		App: app, ID: runtime.NewOneOffID(), Process: "postdeploy", Release: n, Image: rel.Spec.Image,
		Command: sc.Postdeploy, Expand: true, Env: rel.Spec.Config.Env, Timeout: time.Duration(sc.ReleaseTimeout()) * time.Second,
		Stdout: lw, Stderr: lw,
	})
	lw.flush()
	switch {
	case err != nil:
		say(fmt.Sprintf("The postdeploy script could not run: %v (v%d serves all the same)", err, n))
	case exit != 0:
		say(fmt.Sprintf("The postdeploy script exited with status %d (v%d serves all the same)", exit, n))
	}
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
