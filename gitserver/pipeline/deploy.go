package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	transportclient "github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/receive"
	"bex.co/bex/gitserver/upstream"
)

// Cause says what asked for a deploy; the Deployer records it in the release.
type Cause string

// The causes of a deploy.
const (
	CausePush    Cause = "push"
	CauseWebhook Cause = "webhook"
	// CauseDeploy: a user asked for a rebuild (an agent's deploy tool).
	CauseDeploy Cause = "deploy"
)

// DeployRequest is a deploy that does not come from a push: a webhook delivery, an
// agent's deploy.
type DeployRequest struct {
	App string
	// Upstream, when set, is fetched first: its branch of the app's deploy branch's
	// name lands in the app's repository, is built and deployed, and the deploy
	// branch moves to it once it serves, as for a push. The upstream is the
	// source of truth: the move need not be a fast-forward.
	Upstream string
	// Commit, when set (and Upstream is not), is built in place of the deploy
	// branch's tip; it must be in the repository. The branch stays where it is, as
	// with a rollback: the release records the commit.
	Commit string
	Cause  Cause
	// Actor is who asked: a user, or "webhook:<provider>".
	Actor string
	// Delivery is the webhook delivery id, recorded in the release.
	Delivery string
	NoCache  bool
}

// DeployResult is a deploy that served.
type DeployResult struct {
	Release int64
	Commit  string
	URL     string
}

// Errors of Deploy besides ErrAppNotFound; their kinds are the backend's.
var (
	// ErrNothingToDeploy: the app has no repository or no deploy branch yet, and no
	// upstream to fetch one from.
	ErrNothingToDeploy error = &backend.Error{Kind: backend.Invalid, Msg: "nothing to deploy"}
	// ErrBusy: another push or deploy of the app held its lock past LockWait.
	ErrBusy error = &backend.Error{Kind: backend.Conflict, Msg: "another push or deploy of the app is running"}
	// ErrDeployFailed wraps why a deploy did not come to serve (fetch, build,
	// release or rollout); the previous release keeps serving.
	ErrDeployFailed error = &backend.Error{Kind: backend.Failed, Msg: "deploy failed"}
)

// Deploy rebuilds and rolls out an app outside a push, through the same pipeline
// as a push to its deploy branch: build, release, wait for the rollout, then (for
// a fetched upstream commit) move the branch. It holds the app's push lock for the
// whole of it, so a push and a Deploy of one app never run at once. Progress lines
// go to progress (nil: nowhere; the builder keeps the build's log anyway).
func (p *Pipeline) Deploy(ctx context.Context, req DeployRequest, progress io.Writer) (*DeployResult, error) {
	if !appv1.ValidAppName(req.App) {
		return nil, fmt.Errorf("%w: %q is not an app name", ErrAppNotFound, req.App)
	}
	app, err := p.apps.App(ctx, req.App)
	if err != nil {
		return nil, err
	}
	// As for a push: a disk short of its margin refuses the fetch and the build
	// before they start.
	if err := p.CheckDisk("deploy again"); err != nil {
		p.log.Warn("deploy refused", "app", req.App, "cause", req.Cause, "reason", err)
		return nil, err
	}
	out := NewPlainOutput(progress)
	log := p.log.With("app", req.App, "cause", req.Cause, "actor", req.Actor)
	if req.Delivery != "" {
		log = log.With("delivery", req.Delivery)
	}
	unlock, err := p.lockForDeploy(ctx, req.App, fmt.Sprintf("a %s deploy by %s", req.Cause, req.Actor), out)
	if err != nil {
		return nil, err
	}
	defer unlock()

	branch := app.DeployBranch
	if branch == "" {
		branch = "main"
	}
	dir := filepath.Join(p.cfg.ReposDir, req.App+".git")
	repo, err := receive.Open(dir)
	if errors.Is(err, receive.ErrNotExist) && req.Upstream != "" {
		repo, err = receive.Init(dir, branch)
	}
	if errors.Is(err, receive.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no code yet: git push it first", ErrNothingToDeploy, req.App)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the repository of %s: %w", req.App, err)
	}
	branchRef := plumbing.NewBranchReferenceName(branch)
	old, err := repo.Ref(branchRef)
	if err != nil {
		return nil, err
	}

	var commit plumbing.Hash
	switch {
	case req.Upstream != "":
		out.Step("Fetching %s from %s", branch, upstream.Redact(req.Upstream))
		start := time.Now()
		commit, err = p.fetchUpstream(ctx, req.App, repo.Dir, req.Upstream, branch)
		if err != nil {
			log.Warn("fetch failed", "upstream", upstream.Redact(req.Upstream), "err", err)
			if errors.Is(err, syscall.ENOSPC) {
				return nil, backend.Errorf(backend.Invalid, "%s", p.DiskFilled("deploy again"))
			}
			return nil, backend.StoppedAt(fmt.Errorf("%w: fetching %s from %s: %v", ErrDeployFailed, branch, upstream.Redact(req.Upstream), err),
				backend.Stop{Phase: backend.PhaseFetch})
		}
		log.Info("fetched", "commit", commit.String(), "took", time.Since(start))
	case req.Commit != "":
		commit = plumbing.NewHash(req.Commit)
		if len(req.Commit) != 40 || commit.String() != strings.ToLower(req.Commit) || !repo.HasObject(commit) {
			return nil, fmt.Errorf("%w: %s has no commit %q (give a full 40-digit commit id)", ErrNothingToDeploy, req.App, req.Commit)
		}
	default:
		if old.IsZero() {
			return nil, fmt.Errorf("%w: %s has no branch %s yet: git push it first", ErrNothingToDeploy, req.App, branch)
		}
		commit = old
	}

	res := p.BuildAndRelease(ctx, Job{
		App: req.App, RepoDir: repo.Dir, Commit: commit, Branch: branch, NoCache: req.NoCache,
		Actor: req.Actor, Cause: req.Cause, Delivery: req.Delivery, What: string(req.Cause),
	}, out, log)
	if res.Reason != "" {
		log.Info("deploy", append([]any{"result", "failed", "reason", res.Reason, "commit", commit.String()}, res.Timings...)...)
		if res.Cancelled && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, failedDeploy(res)
	}
	if req.Upstream != "" && commit != old {
		// As for a push: the branch follows what runs, once it runs. The lock has
		// been held since old was read, so the compare-and-swap holds unless
		// something outside bex wrote the repository.
		if err := repo.UpdateRef(receive.Command{Name: branchRef, Old: old, New: commit}); err != nil {
			log.Error("update ref", "ref", branchRef.String(), "err", err)
			return nil, fmt.Errorf("release v%d serves, but moving %s failed: %w", res.Release, branch, err)
		}
		if head, err := repo.Head(); err == nil && head != branch {
			_ = repo.SetHead(branch)
		}
	}
	log.Info("deploy", append([]any{"result", "deployed", "release", res.Release, "commit", commit.String()}, res.Timings...)...)
	return &DeployResult{Release: res.Release, Commit: commit.String(), URL: res.URL}, nil
}

// Job is one build and release: a push's deploy branch, or a Deploy.
type Job struct {
	App, RepoDir string
	Commit       plumbing.Hash
	Branch       string
	NoCache      bool
	Actor        string
	Cause        Cause
	Delivery     string
	What         string // "push", "webhook": for the messages
}

// JobResult is how a job ended: Reason is "" when the release serves, else the
// short reason a push reports to git, with Detail the whole story and Err what
// failed (the builder's, the deployer's error), for errors.Is and errors.As.
type JobResult struct {
	Release int64
	URL     string
	Reason  string
	Detail  string
	Err     error
	// Cancelled: the caller's ctx ended (the pusher left) before the release
	// was recorded.
	Cancelled bool
	Timings   []any // slog attributes: build, rollout durations
}

// failed is r ended by cause: reason is what git is told, the detail what the
// log and the caller's error say.
func (r JobResult) failed(cause error, reason, format string, args ...any) JobResult {
	r.Reason, r.Detail, r.Err = reason, fmt.Sprintf(format, args...), cause
	return r
}

// cancelled is r ended by the caller's ctx before the release was recorded.
func (r JobResult) cancelled(detail string) JobResult {
	r.Reason, r.Detail, r.Cancelled = ReasonCancelled, detail, true
	return r
}

// ReasonCancelled is a cancelled job's Reason, which a push reports to git.
const ReasonCancelled = "push cancelled"

// deployFailed is a deploy that ran and did not come to serve: ErrDeployFailed
// with the job's detail. Its cause is kept for what the backend asks of it
// (KeepsServing), not unwrapped: callers tell it by its kind.
type deployFailed struct {
	detail string
	cause  error
	stop   backend.Stop
}

func (e *deployFailed) Error() string { return fmt.Sprintf("%v: %s", ErrDeployFailed, e.detail) }

func (e *deployFailed) Unwrap() error { return ErrDeployFailed }

// KeepsServing is the release the deployer said keeps serving when the rollout
// failed, as its reason (in the detail) says; 0 when it named none.
func (e *deployFailed) KeepsServing() int64 {
	var k interface{ KeepsServing() int64 }
	if errors.As(e.cause, &k) {
		return k.KeepsServing()
	}
	return 0
}

// StoppedAt says where the deploy stopped (backend.StopOf reads it), from the
// job's reason.
func (e *deployFailed) StoppedAt() backend.Stop { return e.stop }

// failedDeploy is the error of a job that did not serve.
func failedDeploy(r JobResult) error {
	return &deployFailed{detail: r.Detail, cause: r.Err, stop: stopOf(r)}
}

// stopOf is where a job that did not serve stopped, by its reason.
func stopOf(r JobResult) backend.Stop {
	s := backend.Stop{Release: r.Release}
	switch r.Reason {
	case "missing config var", "build failed", "predeploy failed":
		s.Phase = backend.PhaseBuild
	case "build timed out":
		s.Phase, s.TimedOut = backend.PhaseBuild, true
	case "release command failed", "release failed", "postdeploy failed":
		s.Phase = backend.PhaseRelease
	default: // "deploy failed": the rollout
		var rollout interface{ RolloutFailure() string }
		switch {
		case errors.Is(r.Err, context.DeadlineExceeded):
			s.Phase, s.TimedOut = backend.PhaseRollout, true
		case errors.As(r.Err, &rollout) && !strings.Contains(rollout.RolloutFailure(), "was replaced by"):
			s.Phase = backend.PhaseHealth
		default:
			s.Phase = backend.PhaseRollout
		}
	}
	return s
}

// BuildAndRelease builds j.Commit, records a release and waits for it to serve,
// saying what happens on out. The caller holds the app's lock. Once the release is
// recorded its rollout is awaited even if ctx ends, so that the caller's ref can
// follow what runs.
func (p *Pipeline) BuildAndRelease(ctx context.Context, j Job, out *Output, log *slog.Logger) JobResult {
	var r JobResult
	slot := p.builds.Slot(func() { out.Step("Waiting for a build slot (%d builds are running)", p.builds.Size()) })
	if err := slot.Acquire(ctx); err != nil {
		return r.cancelled("cancelled while waiting for a build slot")
	}
	// The builder gives the slot back while it waits for something else (the
	// base images), and takes it again.
	defer slot.Release()

	p.locks.describe(j.App, fmt.Sprintf("the deploy of %s by %s", short(j.Commit), j.Actor))
	out.Step("Building %s from %s (%s)", j.App, j.Branch, short(j.Commit))
	start := time.Now()
	buildCtx, cancel := context.WithTimeout(ctx, p.cfg.BuildTimeout)
	res, err := p.builder.Build(buildCtx, BuildRequest{
		App: j.App, RepoDir: j.RepoDir, Commit: j.Commit.String(), Branch: j.Branch, NoCache: j.NoCache, Slot: slot,
	}, out)
	timedOut := errors.Is(buildCtx.Err(), context.DeadlineExceeded)
	cancel()
	p.metrics.build.Observe(time.Since(start).Seconds())
	r.Timings = append(r.Timings, "build", time.Since(start))
	slot.Release()
	var missing *MissingConfigError
	switch {
	case err == nil:
	case errors.As(err, &missing):
		out.Fail("%v", missing)
		return r.failed(missing, "missing config var", "%v", missing)
	case ctx.Err() != nil:
		return r.cancelled("cancelled during the build")
	case timedOut:
		out.Fail("The build ran longer than %s and was stopped.", p.cfg.BuildTimeout)
		return r.failed(err, "build timed out", "the build of %s ran longer than %s", short(j.Commit), p.cfg.BuildTimeout)
	case errors.Is(err, ErrPredeployFailed):
		out.Fail("Build failed: %v", err)
		out.Fail("Nothing changed on %s: %s.", j.App, p.serving(ctx, j.App))
		return r.failed(err, "predeploy failed", "the build of %s failed: %v", short(j.Commit), err)
	default:
		out.Fail("Build failed: %v", err)
		out.Fail("Nothing changed on %s: %s.", j.App, p.serving(ctx, j.App))
		return r.failed(err, "build failed", "the build of %s failed: %v", short(j.Commit), err)
	}

	out.Step("Releasing %s", res.Image)
	return p.releaseAndAwait(ctx, ReleaseRequest{
		App: j.App, Image: res.Image, Commit: j.Commit.String(), Processes: res.Processes, Actor: j.Actor,
		Cause: j.Cause, Delivery: j.Delivery,
		Release: res.Release, Postdeploy: res.Postdeploy, FirstPostdeploy: res.FirstPostdeploy, AppJSON: res.AppJSON, Progress: out,
	}, out, log, r)
}

// releaseAndAwait records req and waits for it to serve, saying what happens on
// out: the second half of a push's deploy, and all of an image's once it is
// pulled. Once the release is recorded its rollout is awaited even if ctx
// ends, so that the caller's ref can follow what runs.
func (p *Pipeline) releaseAndAwait(ctx context.Context, req ReleaseRequest, out *Output, log *slog.Logger, r JobResult) JobResult {
	req.Progress = out
	n, err := p.releaser.Release(ctx, req)
	if err != nil {
		if errors.Is(err, ErrReleaseCommandFailed) {
			out.Fail("%v", err)
			out.Fail("Nothing changed on %s: %s.", req.App, p.serving(ctx, req.App))
			return r.failed(err, "release command failed", "%v", err)
		}
		if ctx.Err() != nil {
			return r.cancelled("cancelled while recording the release")
		}
		log.Error("record release", "err", err)
		out.Fail("Could not record the release: %v", err)
		return r.failed(err, "release failed", "could not record the release: %v", err)
	}
	r.Release = n
	// From here the release is the App's desired state, so the rollout is seen
	// through even if the caller leaves: the ref then follows what runs.
	out.Step("Deploying release v%d", n)
	start := time.Now()
	rolloutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.RolloutTimeout)
	url, err := p.releaser.WaitRollout(rolloutCtx, req.App, n, out)
	timedOut := errors.Is(rolloutCtx.Err(), context.DeadlineExceeded)
	cancel()
	p.metrics.rollout.Observe(time.Since(start).Seconds())
	r.Timings = append(r.Timings, "rollout", time.Since(start))
	if err != nil {
		switch {
		case errors.Is(err, ErrPostdeployFailed):
			// It served, its postdeploy script failed, and the App went back
			// (the error names the release).
			out.Fail("%v", err)
			out.Fail("%s.", upper(p.serving(context.WithoutCancel(ctx), req.App)))
			return r.failed(err, "postdeploy failed", "%v", err)
		case timedOut:
			out.Fail("Release v%d was not serving after %s.", n, p.cfg.RolloutTimeout)
		default:
			out.Fail("Release v%d failed: %v", n, err)
		}
		out.Fail("%s.", upper(p.serving(context.WithoutCancel(ctx), req.App)))
		return r.failed(err, "deploy failed", "release v%d did not serve: %v", n, err)
	}
	out.Step("Application deployed: release v%d", n)
	out.Detail("%s", url)
	r.URL = url
	return r
}

// serving says what serves app after a deploy that failed: "release v3 keeps serving",
// or that nothing does, for a first deploy. A deployer that cannot say gives
// the words that hold either way.
func (p *Pipeline) serving(ctx context.Context, app string) string {
	n, err := p.releaser.Serving(ctx, app)
	switch {
	case err != nil:
		return "whatever served before keeps serving"
	case n == 0:
		return fmt.Sprintf("nothing serves: no release of %s has served yet", app)
	}
	return fmt.Sprintf("release v%d keeps serving", n)
}

// upper is s with its first letter upper case, to begin a sentence.
func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// upstreamRef is where a fetched upstream branch lands before it is deployed. It
// is neither a branch nor a tag, so clones and pushes never see it.
func upstreamRef(branch string) plumbing.ReferenceName {
	return plumbing.ReferenceName("refs/bex/upstream/" + branch)
}

// fetchUpstream fetches branch from upstream into the repository at dir and returns
// its commit. go-git speaks the protocol (its transports: https, ssh, file), but the
// pack goes through receive.StorePack as a push's does, not through go-git's
// parser: the same fsck rules and object size limit, the same bounded memory.
func (p *Pipeline) fetchUpstream(ctx context.Context, app, dir, upstream, branch string) (plumbing.Hash, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.FetchTimeout)
	defer cancel()
	ep, cli, auth, err := p.upstreamClient(ctx, app, upstream)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	repo, err := receive.Open(dir)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	sess, err := cli.NewUploadPackSession(ep, auth)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer sess.Close()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	refs, err := ar.AllReferences()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	ref, ok := refs[plumbing.NewBranchReferenceName(branch)]
	if !ok || ref.Type() != plumbing.HashReference {
		return plumbing.ZeroHash, fmt.Errorf("the upstream has no branch %s", branch)
	}
	want := ref.Hash()
	if !repo.HasObject(want) {
		req := packp.NewUploadPackRequestFromCapabilities(ar.Capabilities)
		if ar.Capabilities.Supports(capability.NoProgress) {
			_ = req.Capabilities.Set(capability.NoProgress)
		}
		req.Wants = []plumbing.Hash{want}
		have, err := repo.Refs()
		if err != nil {
			return plumbing.ZeroHash, err
		}
		seen := map[plumbing.Hash]bool{}
		for _, h := range have {
			if !seen[h] {
				seen[h] = true
				req.Haves = append(req.Haves, h)
			}
		}
		if old, err := repo.Ref(upstreamRef(branch)); err == nil && !old.IsZero() && !seen[old] && repo.HasObject(old) {
			req.Haves = append(req.Haves, old)
		}
		resp, err := sess.UploadPack(ctx, req)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		var pack io.Reader = resp
		switch {
		case req.Capabilities.Supports(capability.Sideband64k):
			pack = sideband.NewDemuxer(sideband.Sideband64k, resp)
		case req.Capabilities.Supports(capability.Sideband):
			pack = sideband.NewDemuxer(sideband.Sideband, resp)
		}
		_, err = repo.StorePack(ctx, pack, receive.Limits{MaxPackBytes: p.cfg.MaxPackBytes, MaxObjectBytes: p.cfg.MaxObjectBytes, MaxObjects: p.cfg.MaxPushObjects, Tips: []plumbing.Hash{want}})
		if err != nil {
			// A pack refused part way (the disk full) leaves the sender writing:
			// Close waits for it (file:// waits for its git-upload-pack), so read
			// the rest away first, at most the pack limit.
			_, _ = io.CopyN(io.Discard, pack, p.cfg.MaxPackBytes)
		}
		resp.Close()
		if err != nil {
			return plumbing.ZeroHash, err
		}
	}
	if err := repo.SetUpstreamRef(upstreamRef(branch), want); err != nil {
		return plumbing.ZeroHash, err
	}
	return want, nil
}

// upstreamClient checks an upstream URL against what this server allows (the
// upstream package's Policy: the same check as when it was set, for an App
// written straight to the API) and returns its endpoint, the transport to fetch
// it with and how to authenticate: https through an http.Client whose every
// connection is checked by the policy's dialer, with the app's kept credentials
// when it has some; ssh through the same checked dialer, with the app's own
// deploy key (never the host key: a git host that trusts one app's key must not
// serve another app), the upstream's host key checked against known hosts;
// file:// only with AllowFileUpstreams.
func (p *Pipeline) upstreamClient(ctx context.Context, app, raw string) (*transport.Endpoint, transport.Transport, transport.AuthMethod, error) {
	policy := p.upstreamPolicy()
	if err := policy.Check(ctx, raw); err != nil {
		return nil, nil, nil, err
	}
	ep, err := upstream.Parse(raw)
	if err != nil {
		return nil, nil, nil, err
	}
	switch ep.Protocol {
	case "https":
		var auth transport.AuthMethod
		if p.upstreamAuth != nil {
			user, pass, ok, err := p.upstreamAuth.Credentials(ctx, app)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("reading the upstream credentials of %s: %w", app, err)
			}
			if ok {
				auth = &githttp.BasicAuth{Username: user, Password: pass}
			}
		}
		return ep, githttp.NewClient(policy.HTTPClient(p.cfg.FetchTimeout, p.cfg.UpstreamRootCAs)), auth, nil
	case "file":
		cli, err := transportclient.NewClient(ep)
		return ep, cli, nil, err
	case "ssh":
		if p.upstreamAuth == nil {
			return nil, nil, nil, errors.New("this server keeps no deploy keys, so it fetches no ssh upstreams")
		}
		cb, err := knownhosts.New(p.cfg.UpstreamKnownHosts)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("ssh upstreams need the upstream's host key in %s (ssh-keyscan -p %d %s >> %s): %v",
				p.cfg.UpstreamKnownHosts, ep.Port, ep.Host, p.cfg.UpstreamKnownHosts, errors.Unwrap(err))
		}
		signer, err := p.upstreamAuth.DeployKey(ctx, app)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("the deploy key of %s: %w", app, err)
		}
		user := ep.User
		if user == "" {
			user = "git"
		}
		// go-git's ssh transport has no dialer of its own to set: it dials through
		// the endpoint's proxy, which is the policy's checked dialer.
		ep.Proxy = policy.ProxyOptions()
		auth := &gitssh.PublicKeys{User: user, Signer: signer,
			HostKeyCallbackHelper: gitssh.HostKeyCallbackHelper{HostKeyCallback: cb}}
		return ep, gitssh.DefaultClient, auth, nil
	}
	return nil, nil, nil, fmt.Errorf("upstream %q: bex fetches over https://, ssh:// (or git@host:path) and file://", upstream.Redact(raw))
}

// upstreamPolicy is what upstreams this server fetches from.
func (p *Pipeline) upstreamPolicy() upstream.Policy {
	return upstream.Policy{AllowPrivate: p.cfg.AllowPrivateUpstreams, AllowFile: p.cfg.AllowFileUpstreams, Resolver: p.cfg.UpstreamResolver}
}

// lockForDeploy takes app's lock for a deploy that is not a push (owner says
// what it is, for whoever waits behind it), as Lock does, telling out while it
// waits.
func (p *Pipeline) lockForDeploy(ctx context.Context, app, owner string, out *Output) (unlock func(), err error) {
	return p.Lock(ctx, app, owner, func(holder string) {
		out.Step("Waiting for %s to finish (one deploy per app at a time)", holder)
	})
}

func short(h plumbing.Hash) string { return h.String()[:7] }
