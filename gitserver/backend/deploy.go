package backend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
)

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Deploy rebuilds and rolls out an app u may use: the given commit (a full
// object id in its repository), or its deploy branch, fetched from its upstream
// when it has one. It returns when the release serves, or why it does not (the
// previous release keeps serving).
func (b *Backend) Deploy(ctx context.Context, u *User, name, commit string) (*DeployResult, error) {
	if err := u.mayChange("deploy"); err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if commit != "" && !commitRE.MatchString(commit) {
		return nil, Errorf(Invalid, "commit %q: give a full 40-digit lower-case commit id of %s's repository", commit, name)
	}
	if b.cfg.Deployer == nil {
		return nil, Errorf(Invalid, "this server does not build")
	}
	req := DeployRequest{App: name, Commit: commit, Cause: CauseDeploy, Actor: u.Name}
	if commit == "" {
		req.Upstream = a.Spec.Git.Upstream
	}
	if err := wouldChange(ctx, func(p *Plan) {
		p.Release, p.ServingRelease, p.Commit, p.Upstream = b.nextRelease(ctx, a), a.Status.Revision, commit, req.Upstream
		what := fmt.Sprintf("the commit %s", commit)
		if commit == "" {
			p.Branch = a.Spec.Git.DeployBranch
			if p.Branch == "" {
				p.Branch = "main"
			}
			what = fmt.Sprintf("the tip of %s", p.Branch)
			if req.Upstream != "" {
				what += fmt.Sprintf(", fetched first from %s", req.Upstream)
			}
		}
		p.Changes = append(p.Changes, fmt.Sprintf("would build %s and roll it out as release v%d; v%d would keep serving until its instances are healthy", what, p.Release, a.Status.Revision))
	}); err != nil {
		return nil, err
	}
	res, err := b.deploy(ctx, req, a.Status.Revision)
	b.audit(u, "deploy", name, deployAttrs(a, commit, res, err)...)
	return res, err
}

// deployAttrs are the audit's facts of a deploy of a that built commit (""
// the deploy branch) and ended with res or err.
func deployAttrs(a *appv1.App, commit string, res *DeployResult, err error) []any {
	attrs := []any{"before", a.Status.Revision}
	if commit != "" {
		attrs = append(attrs, "commit", commit)
	}
	if res != nil {
		attrs = append(attrs, "release", res.Release)
		if commit == "" && res.Commit != "" {
			attrs = append(attrs, "commit", res.Commit)
		}
	}
	if err != nil {
		if stop, ran := StopOf(err); ran && stop.Release > 0 {
			attrs = append(attrs, "release", stop.Release)
		}
		attrs = append(attrs, "error", err.Error())
	}
	return attrs
}

// deploy runs req; served is the release that served before it (0: none), for
// what a failure says keeps serving.
func (b *Backend) deploy(ctx context.Context, req DeployRequest, served int64) (*DeployResult, error) {
	res, err := b.cfg.Deployer.Deploy(ctx, req)
	switch KindOf(err) {
	case Conflict:
		return nil, Errorf(Conflict, "%w: try again once it ends", err)
	case Failed:
		if served == 0 {
			return nil, Errorf(Failed, "%w; nothing serves: no release of %s has served yet (build_logs shows the build)", err, req.App)
		}
		return nil, Errorf(Failed, "%w; release v%d keeps serving (build_logs shows the build)", err, served)
	}
	return res, err
}

// Hook is what the webhook handler knows of one app's webhook.
type Hook struct {
	App string
	// DeployBranch is the branch whose pushes redeploy; "main" when empty.
	DeployBranch string
	// Secrets verify deliveries: the current one, then during a rotation the
	// previous one. A hook without secrets takes no delivery.
	Secrets [][]byte
}

// Hook returns app's webhook, for a delivery not yet authenticated: a NotFound
// error when there is no such app. It reads the cache and one Secret.
func (b *Backend) Hook(ctx context.Context, app string) (*Hook, error) {
	if !appv1.ValidAppName(app) {
		return nil, noSuchApp(app)
	}
	a := &appv1.App{}
	if err := b.cfg.Reader.Get(ctx, b.key(app), a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, noSuchApp(app)
		}
		return nil, err
	}
	valid, err := b.secretStore().Valid(ctx, a.Spec.Git.WebhookSecretRef)
	if err != nil {
		return nil, err
	}
	return &Hook{App: app, DeployBranch: a.Spec.Git.DeployBranch, Secrets: valid}, nil
}

// Redeploy is a webhook delivery's redeploy of app (already authenticated by
// its signature): the deploy branch, fetched from the upstream when the app has
// one, built and rolled out through the push's pipeline and lock.
func (b *Backend) Redeploy(ctx context.Context, app, provider, delivery string) error {
	if b.cfg.Deployer == nil {
		return Errorf(Invalid, "this server does not build")
	}
	a := &appv1.App{}
	if err := b.cfg.Reader.Get(ctx, b.key(app), a); err != nil {
		if apierrors.IsNotFound(err) {
			return noSuchApp(app)
		}
		return err
	}
	res, err := b.cfg.Deployer.Deploy(ctx, DeployRequest{App: app, Upstream: a.Spec.Git.Upstream, Cause: CauseWebhook,
		Actor: "webhook:" + provider, Delivery: delivery})
	attrs := append(deployAttrs(a, "", res, err), "provider", provider, "delivery", delivery)
	b.log.Info("audit", append([]any{"user", "webhook:" + provider, "command", "webhook", "app", app}, attrs...)...)
	e := AuditEntry{User: "webhook:" + provider, Via: ViaWebhook, Command: "webhook", App: app}
	addAttrs(&e, attrs)
	b.keep(e)
	return err
}

func (b *Backend) secretStore() *hooksecrets.Store {
	return &hooksecrets.Store{Apps: b.cfg.Reader, Secrets: b.cfg.Client, Namespace: b.cfg.Namespace, SecretsNamespace: b.cfg.SecretsNamespace}
}

// Releases lists app's releases, newest first, at most limit (0: all).
func (b *Backend) Releases(ctx context.Context, u *User, name string, limit int) ([]ReleaseInfo, int, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, 0, err
	}
	rels, err := b.cfg.Releases.List(ctx, a.Name)
	if err != nil {
		return nil, 0, fmt.Errorf("listing the releases of %s: %w", a.Name, err)
	}
	if limit <= 0 || limit > len(rels) {
		limit = len(rels)
	}
	out := make([]ReleaseInfo, 0, limit)
	for i := range rels[:limit] {
		out = append(out, releaseInfoOf(&rels[i], a))
	}
	return out, len(rels), nil
}

// Rollback records a release of app that runs release to's image and config
// again (to 0: the newest release before the current one that served). It
// returns to and the new release's number; await it with Await.
func (b *Backend) Rollback(ctx context.Context, u *User, name string, to int64) (int64, int64, error) {
	if err := u.mayChange("rollback"); err != nil {
		return 0, 0, err
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return 0, 0, err
	}
	if to < 0 {
		return 0, 0, Errorf(Invalid, "v%d is not a release: give its number, e.g. rollback %s v3 (releases %s lists them)", to, name, name)
	}
	if to, err = b.rollbackTarget(ctx, a, to); err != nil {
		return 0, 0, err
	}
	if err := b.planRollback(ctx, a, to); err != nil {
		return 0, 0, err
	}
	n, err := b.cfg.Releases.Rollback(ctx, a.Name, to, u.Name)
	if err != nil {
		return 0, 0, fmt.Errorf("recording the rollback of %s: %w", a.Name, err)
	}
	b.audit(u, "rollback", a.Name, "to", to, "before", a.Status.Revision, "release", n)
	return to, n, nil
}

// rollbackTarget picks the release a rollback of app brings back: to when not
// 0 (it must exist), else the newest release before the current one that served.
func (b *Backend) rollbackTarget(ctx context.Context, app *appv1.App, to int64) (int64, error) {
	rels, err := b.cfg.Releases.List(ctx, app.Name)
	if err != nil {
		return 0, fmt.Errorf("listing the releases of %s: %w", app.Name, err)
	}
	if to != 0 {
		if !slices.ContainsFunc(rels, func(r appv1.Release) bool { return r.Spec.Number == to }) {
			return 0, Errorf(NotFound, "%s has no release v%d to roll back to (releases %s lists them; old ones are pruned)", app.Name, to, app.Name)
		}
	} else {
		for _, r := range rels { // newest first; a release that never served is no way back
			if r.Spec.Number < app.Spec.Release && r.Annotations[appv1.AnnotationReleaseFailed] == "" {
				to = r.Spec.Number
				break
			}
		}
		if to == 0 {
			return 0, Errorf(Invalid, "%s has no release before v%d to roll back to (releases %s lists them)", app.Name, app.Spec.Release, app.Name)
		}
	}
	if to == app.Spec.Release {
		return 0, Errorf(Conflict, "v%d is the current release of %s already", to, app.Name)
	}
	return to, nil
}

// Await waits up to the rollout timeout for release n of app to serve and
// returns its URL, calling progress (when not nil) with the deployer's messages.
// A release that fails is withdrawn and reported as Failed.
func (b *Backend) Await(ctx context.Context, app string, n int64, progress func(string)) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, b.cfg.RolloutTimeout)
	defer cancel()
	url, err := b.cfg.Releases.Await(wctx, app, n, progress)
	var failed RolloutFailure
	switch {
	case errors.As(err, &failed):
		// Its instances did not come up healthy, unless a newer release took
		// its place first.
		phase := PhaseHealth
		if strings.Contains(failed.RolloutFailure(), "was replaced by") {
			phase = PhaseRollout
		}
		// bex's words on the first line: the lines after it are what the app
		// printed last, which an agent is shown as the app's output.
		reason, lines, _ := strings.Cut(failed.RolloutFailure(), "\n")
		if !strings.Contains(reason, "keeps serving") {
			if h, ok := strings.CutSuffix(reason, "; last log lines:"); ok {
				reason = h + "; the previous release keeps serving. Its last log lines:"
			} else {
				reason = strings.TrimSuffix(reason, ".") + "; the previous release keeps serving"
			}
		}
		msg := fmt.Sprintf("release v%d of %s did not roll out: %s", n, app, reason)
		if lines != "" {
			msg += "\n" + lines
		}
		return "", &Error{Kind: Failed, Msg: msg,
			Err: StoppedAt(err, Stop{Phase: phase, Release: n})}
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return "", &Error{Kind: Failed, Msg: fmt.Sprintf("release v%d of %s is not serving after %s: it may still come up (apps:info %s)", n, app, b.cfg.RolloutTimeout.Round(time.Second), app),
			Err: StoppedAt(err, Stop{Phase: PhaseRollout, TimedOut: true, Release: n})}
	}
	return url, err
}

// planRollback ends a dry run of the rollback of a to release to with what it
// would bring back: that release, its image, how its config differs from the
// App's today. Outside a dry run it does nothing.
func (b *Backend) planRollback(ctx context.Context, a *appv1.App, to int64) error {
	if planOf(ctx) == nil {
		return nil
	}
	rels, err := b.cfg.Releases.List(ctx, a.Name)
	if err != nil {
		return fmt.Errorf("listing the releases of %s: %w", a.Name, err)
	}
	i := slices.IndexFunc(rels, func(r appv1.Release) bool { return r.Spec.Number == to })
	if i < 0 {
		return Errorf(NotFound, "%s has no release v%d to roll back to (releases %s lists them; old ones are pruned)", a.Name, to, a.Name)
	}
	return wouldChange(ctx, func(p *Plan) {
		r := releaseInfoOf(&rels[i], a)
		p.RollbackTo, p.Image = &r, r.Image
		p.Config = configDiff(a.Spec.Env, rels[i].Spec.Config.Env)
		p.Release, p.ServingRelease = b.nextRelease(ctx, a), a.Status.Revision
		p.Changes = append(p.Changes, fmt.Sprintf("would record release v%d running the image and config of v%d (%s) and roll it out; v%d would keep serving until its instances are healthy", p.Release, to, r.Image, a.Status.Revision))
		p.Changes = append(p.Changes, p.Config.sentences()...)
	})
}
