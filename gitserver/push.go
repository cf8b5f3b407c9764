package gitserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/gitserver/receive"
	"bex.co/bex/gitserver/receive/fsck"
)

// push is one git-receive-pack session.
type push struct {
	s     *Server
	sess  ssh.Session
	log   *slog.Logger
	user  *backend.User
	app   *backend.PushTarget // Exists false until ensureApp made it
	name  string
	repo  *receive.Repo
	req   *receive.Request
	out   *pipeline.Output
	rejct map[plumbing.ReferenceName]string // reason per rejected ref

	noCache, async bool
	timings        []any // slog attributes: receive, build, rollout durations
	// unpackErr is report-status's unpack error: set when the pack was not
	// stored.
	unpackErr error
	unlock    func() // frees the app's push lock; nil once handed to a background deploy
}

// Push options that bex understands (git push -o NAME).
const (
	optionNoCache = "no-cache"
	optionAsync   = "async"
)

// receivePack runs a push and returns the SSH exit status: 0 when every ref moved.
func (s *Server) receivePack(ctx context.Context, sess ssh.Session, user *backend.User, name string, log *slog.Logger) int {
	app, err := s.admit.AdmitPush(ctx, user, name)
	if err != nil {
		if backend.KindOf(err) == backend.Internal {
			log.Error("app lookup failed", "err", err)
			fatal(sess, "internal error: try again")
			return 1
		}
		// Refused (no access, may not create apps): git shows the one line.
		s.metrics.pushes.WithLabelValues("rejected").Inc()
		fatal(sess, err.Error())
		return 1
	}
	// A disk short of its margin refuses the push before anything is read: git
	// shows the one line, and nothing was written.
	if err := s.pipeline.CheckDisk("push again"); err != nil {
		s.metrics.pushes.WithLabelValues("rejected").Inc()
		log.Warn("push refused", "reason", err)
		fatal(sess, err.Error())
		return 1
	}
	// From here the push works on name: taking the user's access away ends it
	// (while it waits for the lock, too).
	backend.Used(ctx, name)

	p := &push{s: s, sess: sess, log: log, user: user, app: app, name: name, rejct: map[plumbing.ReferenceName]string{}}
	// One push per app at a time, from before the advertisement: a push that waited
	// then sees the refs the previous one left, so git itself decides whether it is a
	// fast-forward, as with any push to a moved branch. Waiting is reported on
	// stderr, which git shows as it is; the sideband is not negotiated yet.
	unlock, err := s.pipeline.Lock(ctx, name, "a push by "+user.Name, func(holder string) {
		fmt.Fprintf(sess.Stderr(), "-----> Waiting for %s to finish (one push per app at a time)\n", holder)
	})
	if err != nil {
		if ctx.Err() == nil {
			fatal(sess, fmt.Sprintf("another push to %s is still running after %s: try again later", name, s.pipeline.Config().LockWait))
		}
		s.metrics.pushes.WithLabelValues("rejected").Inc()
		return 1
	}
	p.unlock = unlock
	defer func() {
		if p.unlock != nil {
			p.unlock()
			// After the lock is free: the repack takes it.
			if p.moved() {
				s.pipeline.RepackLater(name)
			}
		}
	}()
	p.repo, err = receive.Open(s.pipeline.RepositoryDir(name))
	if err != nil && !errors.Is(err, receive.ErrNotExist) {
		log.Error("open repository", "err", err)
		fatal(sess, "internal error: try again")
		return 1
	}
	caps := receive.Capabilities(s.cfg.Agent)
	if p.repo != nil {
		err = p.repo.AdvertiseRefs(sess, caps)
	} else {
		err = receive.AdvertiseEmpty(sess, caps)
	}
	if err != nil {
		log.Error("advertise refs", "err", err)
		return 1
	}
	p.req, err = receive.ReadRequest(sess)
	if errors.Is(err, receive.ErrNoCommands) {
		return 0 // nothing to push: git says "Everything up-to-date"
	}
	if err != nil {
		log.Info("bad update request", "err", err)
		fatal(sess, err.Error())
		return 1
	}
	p.out = pipeline.NewOutput(sess, p.req.Supports(capability.Sideband64k))
	stopKeepAlive := p.keepAlive()
	result := p.run(ctx)
	stopKeepAlive()
	p.report()
	s.metrics.pushes.WithLabelValues(result).Inc()
	attrs := append([]any{"result", result, "commands", p.describeCommands()}, p.timings...)
	log.Info("push", attrs...)
	if len(p.rejct) > 0 {
		return 1
	}
	return 0
}

// run does the push up to the ref updates and returns the result for metrics.
func (p *push) run(ctx context.Context) string {
	if err := p.ensureApp(ctx); err != nil {
		p.rejectAll(err.Error())
		return "rejected"
	}
	p.readOptions()

	if p.req.HasPack() {
		start := time.Now()
		lim := p.s.pipeline.Limits()
		for _, cmd := range p.req.Commands {
			if !cmd.IsDelete() {
				lim.Tips = append(lim.Tips, cmd.New)
			}
		}
		pack, err := p.repo.StorePack(ctx, p.sess, lim)
		p.s.metrics.receive.Observe(time.Since(start).Seconds())
		p.timings = append(p.timings, "receive", time.Since(start))
		if refusal := objectRefusal(err); refusal != "" {
			// One line, in git's words, on the remote: line and on every ref: the
			// pack is whole, one of its objects is not acceptable.
			p.log.Info("push refused", "reason", refusal)
			p.out.Fail("%s", refusal)
			p.rejectAll(refusal)
			return "rejected"
		}
		if errors.Is(err, syscall.ENOSPC) {
			// The disk filled while the pack came in: receive removed what it wrote,
			// and no ref moves. Say so in the words of the margin's refusal.
			p.log.Warn("pack refused: disk full", "err", err)
			p.out.Fail("%s", p.s.pipeline.DiskFilled("push again"))
			p.refusePack()
			return "rejected"
		}
		if err != nil {
			p.log.Info("pack refused", "err", err)
			p.out.Fail("The pushed data could not be stored: %v", err)
			p.refusePack()
			return "rejected"
		}
		p.log.Debug("pack stored", "pack", pack.Name, "objects", pack.Objects, "completed", pack.Completed, "bytes", pack.Bytes)
	}

	deployRef := plumbing.NewBranchReferenceName(p.app.DeployBranch)
	var deploy *receive.Command
	for i, cmd := range p.req.Commands {
		if err := p.repo.CheckCommand(cmd); err != nil {
			p.rejct[cmd.Name] = err.Error()
			continue
		}
		if cmd.Name == deployRef {
			if cmd.IsDelete() {
				p.out.Fail("%s is the deploy branch of %s: it is what runs, so it cannot be deleted.", p.app.DeployBranch, p.name)
				p.rejct[cmd.Name] = "deleting the deploy branch is not allowed"
				continue
			}
			deploy = &p.req.Commands[i]
		}
	}

	if deploy != nil {
		p.s.pipeline.Describe(p.name, fmt.Sprintf("the deploy of %s by %s", short(deploy.New), p.user.Name))
	}

	// The app's lock has been held since before the advertisement, so the old values
	// hold unless something outside bex wrote the repository. Check before building,
	// so that nothing is built that cannot land.
	for _, cmd := range p.req.Commands {
		if _, done := p.rejct[cmd.Name]; done {
			continue
		}
		cur, err := p.repo.Ref(cmd.Name)
		if err != nil || cur != cmd.Old {
			p.rejct[cmd.Name] = "fetch first: " + cmd.Name.Short() + " changed during the push"
		}
	}
	if deploy != nil {
		if _, rejected := p.rejct[deploy.Name]; rejected {
			deploy = nil
		}
	}

	result := "stored"
	switch {
	case deploy != nil && p.async:
		p.updateRefs()
		if _, rejected := p.rejct[deploy.Name]; !rejected {
			p.deployInBackground(*deploy)
			return "deployed"
		}
		return "rejected"
	case deploy != nil:
		if res := p.deploy(ctx, *deploy); res.Reason != "" {
			p.rejct[deploy.Name] = res.Reason
			result = "failed"
			if res.Cancelled {
				result = "cancelled"
			}
		} else {
			result = "deployed"
		}
	}
	if p.req.Supports(capability.Atomic) && len(p.rejct) > 0 {
		p.rejectAll("atomic push failure")
		return result
	}
	p.updateRefs()
	for _, cmd := range p.req.Commands {
		if _, rejected := p.rejct[cmd.Name]; rejected || cmd.Name == deployRef || cmd.IsDelete() {
			continue
		}
		if cmd.Name.IsBranch() {
			p.out.Step("Stored branch %s without deploying: only %s deploys %s.", cmd.Name.Short(), p.app.DeployBranch, p.name)
			p.out.Detail("To deploy it: git push bex %s:%s", cmd.Name.Short(), p.app.DeployBranch)
		} else {
			p.out.Step("Stored tag %s.", cmd.Name.Short())
		}
	}
	if len(p.rejct) > 0 && result == "stored" {
		result = "rejected"
	}
	return result
}

// objectRefusal is the line that refuses a push for its objects (an fsck
// finding, an object over the size limit, more objects than the limit), or ""
// for any other outcome.
func objectRefusal(err error) string {
	var fe *fsck.Error
	var big *receive.TooLargeError
	var many *receive.TooManyObjectsError
	switch {
	case errors.As(err, &fe):
		return fe.Error()
	case errors.As(err, &big):
		return big.Error()
	case errors.As(err, &many):
		// The limit is per push: the history arrives in parts, and a push to a
		// branch other than the deploy branch stores without building.
		return many.Error() + ": push older commits first (git push bex <older commit>:refs/heads/import, then the rest), or have the operator raise --max-push-objects"
	}
	return ""
}

// ensureApp creates the app and its repository on the first push, and settles the
// deploy branch: the app's, or for a new app the first branch pushed (main when it
// is among them), as Dokku does.
func (p *push) ensureApp(ctx context.Context) error {
	if !p.app.Exists {
		p.out.Step("Creating app %s", p.name)
		app, err := p.s.admit.CreatePushedApp(ctx, p.user, p.name)
		if backend.KindOf(err) == backend.Forbidden {
			// Made meanwhile by a concurrent push, for others.
			return err
		}
		if err != nil {
			p.log.Error("create app", "err", err)
			p.out.Fail("Could not create app %s: %v", p.name, err)
			return errors.New("could not create the app")
		}
		p.app = app
	}
	if p.app.DeployBranch == "" {
		branch := ""
		for _, cmd := range p.req.Commands {
			if !cmd.Name.IsBranch() || cmd.IsDelete() {
				continue
			}
			if branch == "" || cmd.Name.Short() == "main" {
				branch = cmd.Name.Short()
			}
		}
		if branch == "" {
			branch = "main"
		} else if err := p.s.admit.SetDeployBranch(ctx, p.user, p.name, branch); err != nil {
			p.log.Error("set deploy branch", "err", err)
			return errors.New("could not record the deploy branch")
		}
		p.app.DeployBranch = branch
	}
	if p.repo == nil {
		repo, err := receive.Init(p.s.pipeline.RepositoryDir(p.name), p.app.DeployBranch)
		if err != nil {
			// A concurrent first push may have created it.
			if repo, err = receive.Open(p.s.pipeline.RepositoryDir(p.name)); err != nil {
				p.log.Error("init repository", "err", err)
				return errors.New("could not create the repository")
			}
		}
		p.repo = repo
	}
	return nil
}

func (p *push) readOptions() {
	for _, opt := range p.req.Options {
		switch opt {
		case optionNoCache:
			p.noCache = true
		case optionAsync:
			p.async = true
		default:
			p.out.Detail("Ignoring unknown push option %q (bex knows %s and %s).", opt, optionNoCache, optionAsync)
		}
	}
}

// deploy builds cmd.New, records a release and waits for it to serve. Its
// Reason is the rejection's, or "" when the release serves.
func (p *push) deploy(ctx context.Context, cmd receive.Command) pipeline.JobResult {
	res := p.s.pipeline.BuildAndRelease(ctx, pipeline.Job{
		App: p.name, RepoDir: p.repo.Dir, Commit: cmd.New, Branch: cmd.Name.Short(), NoCache: p.noCache,
		Actor: p.user.Name, Cause: pipeline.CausePush, What: "push",
	}, p.out, p.log)
	p.timings = append(p.timings, res.Timings...)
	failure := res.Reason
	if res.Detail != "" {
		failure += ": " + res.Detail
	}
	p.s.admit.Pushed(p.user, p.name, backend.PushDone{Commit: cmd.New.String(), Branch: cmd.Name.Short(),
		Before: p.app.Serving, Release: res.Release, Failure: failure})
	return res
}

// deployInBackground runs an async push's deploy after the ref moved and the pusher
// got its report. It takes over the app's lock and frees it when done.
func (p *push) deployInBackground(cmd receive.Command) {
	p.out.Step("Deploying %s in the background (push option async).", short(cmd.New))
	p.out.Detail("The app's status shows the result: kubectl get app %s", p.name)
	bg := *p
	bg.out = pipeline.NewOutput(io.Discard, false)
	unlock := p.unlock
	p.unlock = nil
	p.s.pipeline.Background(func() {
		defer func() {
			unlock()
			p.s.pipeline.RepackLater(p.name) // the ref moved before the deploy began
		}()
		ctx := context.WithoutCancel(p.sess.Context())
		if res := bg.deploy(ctx, cmd); res.Reason != "" {
			p.log.Warn("background deploy failed", "commit", cmd.New.String(), "reason", res.Reason)
			return
		}
		p.log.Info("background deploy done", "commit", cmd.New.String())
	})
}

// updateRefs moves every ref not rejected so far; a move that fails rejects its ref.
func (p *push) updateRefs() {
	for _, cmd := range p.req.Commands {
		if _, rejected := p.rejct[cmd.Name]; rejected {
			continue
		}
		if err := p.repo.UpdateRef(cmd); err != nil {
			if errors.Is(err, receive.ErrStale) {
				p.rejct[cmd.Name] = "fetch first: " + cmd.Name.Short() + " changed during the push"
				continue
			}
			p.log.Error("update ref", "ref", cmd.Name.String(), "err", err)
			p.rejct[cmd.Name] = "could not update the ref"
		}
	}
	if p.app.DeployBranch != "" {
		if head, err := p.repo.Head(); err == nil && head != p.app.DeployBranch {
			_ = p.repo.SetHead(p.app.DeployBranch)
		}
	}
}

// moved reports whether the push wrote to the repository: a ref moved.
func (p *push) moved() bool {
	if p.repo == nil || p.req == nil {
		return false
	}
	for _, cmd := range p.req.Commands {
		if _, rejected := p.rejct[cmd.Name]; !rejected {
			return true
		}
	}
	return false
}

// errUnpacker is report-status's unpack error for a pack that was not stored.
var errUnpacker = errors.New("unpacker error")

// refusePack records that the pack was not stored: report-status says so on
// its unpack line, and every ref is rejected with the same words.
func (p *push) refusePack() {
	p.unpackErr = errUnpacker
	p.rejectAll(errUnpacker.Error())
}

// rejectAll rejects every command not rejected yet with reason.
func (p *push) rejectAll(reason string) {
	for _, cmd := range p.req.Commands {
		if _, done := p.rejct[cmd.Name]; !done {
			p.rejct[cmd.Name] = reason
		}
	}
}

// report writes report-status (when the client asked for it) and ends the stream.
func (p *push) report() {
	if p.req.Supports(capability.ReportStatus) {
		results := make([]receive.Result, 0, len(p.req.Commands))
		for _, cmd := range p.req.Commands {
			results = append(results, receive.Result{Name: cmd.Name, Reason: p.rejct[cmd.Name]})
		}
		if err := receive.WriteReport(p.out.Report(), p.unpackErr, results); err != nil {
			p.log.Info("writing report", "err", err)
		}
	}
	p.out.Flush()
}

// keepAlive sends keep-alive packets while the push is silent; the returned func
// stops it.
func (p *push) keepAlive() func() {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(p.s.cfg.KeepAlive / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.out.KeepAlive(p.s.cfg.KeepAlive)
			}
		}
	}()
	return func() { close(done) }
}

func (p *push) describeCommands() string {
	parts := make([]string, 0, len(p.req.Commands))
	for _, c := range p.req.Commands {
		parts = append(parts, fmt.Sprintf("%s %s..%s", c.Name.Short(), short(c.Old), short(c.New)))
	}
	return strings.Join(parts, ", ")
}

func short(h plumbing.Hash) string { return h.String()[:7] }
