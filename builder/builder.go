package builder

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	contentproxy "github.com/containerd/containerd/v2/core/content/proxy"
	dockerconfig "github.com/docker/cli/cli/config"
	bkclient "github.com/moby/buildkit/client"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/auth/authprovider"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"

	"bex.co/bex/builder/appjson"
	"bex.co/bex/builder/plan"
	"bex.co/bex/internal/buildslot"
	"bex.co/bex/internal/bytesize"
)

// Builder builds apps with a buildkitd.
type Builder struct {
	cfg   Config
	slots *buildslot.Pool // the builder's own, for requests without a Slot
	logs  *logStore
	log   *slog.Logger
	oom   *oomWatch // nil without Config.StepCgroup
}

// Errors a caller may tell apart. Their text is written for the person who pushed.
var (
	// ErrUnavailable: buildkitd cannot be reached.
	ErrUnavailable = errors.New("builder unavailable")
	// ErrTimeout: the build ran longer than Config.Timeout.
	ErrTimeout = errors.New("build timed out")
	// ErrStepOutOfMemory: the kernel killed a build step at the steps' memory limit.
	ErrStepOutOfMemory = errors.New("build step ran out of memory")
)

// New makes a Builder. It does not contact buildkitd; Preflight does.
func New(cfg Config, log *slog.Logger) (*Builder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withPaths()
	if log == nil {
		log = slog.Default()
	}
	// Root's alone, as the rest of the state dir: build logs hold what a build
	// printed. Directories left wider by an older bex are tightened.
	for _, d := range []string{cfg.WorkDir, cfg.LogDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, err
		}
	}
	b := &Builder{
		cfg:   cfg,
		slots: buildslot.NewPool(cfg.MaxConcurrent),
		logs:  &logStore{dir: cfg.LogDir, keep: cfg.KeepLogs, maxBytes: cfg.MaxLogBytes},
		log:   log.WithGroup("builder"),
	}
	if cfg.StepCgroup != "" {
		w, err := watchOOM(cfg.StepCgroup)
		if err != nil {
			return nil, err
		}
		b.oom = w
	}
	return b, nil
}

// Close stops watching the build steps' cgroup.
func (b *Builder) Close() error { return b.oom.Close() }

// Preflight checks that buildkitd answers and has a worker.
func (b *Builder) Preflight(ctx context.Context) error {
	c, err := b.client(ctx)
	if err != nil {
		return err
	}
	return c.Close()
}

func (b *Builder) client(ctx context.Context) (*bkclient.Client, error) {
	unavailable := func(err error) error {
		return fmt.Errorf("%w: cannot reach buildkitd at %s: %v", ErrUnavailable, b.cfg.Address, err)
	}
	var opts []bkclient.ClientOpt
	if t := b.cfg.TLS; t.enabled() {
		opts = append(opts, bkclient.WithServerConfig(t.ServerName, t.CA))
		if t.Cert != "" {
			opts = append(opts, bkclient.WithCredentials(t.Cert, t.Key))
		}
	}
	c, err := bkclient.New(ctx, b.cfg.Address, opts...)
	if err != nil {
		return nil, unavailable(err)
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Info(ictx); err != nil {
		c.Close()
		return nil, unavailable(err)
	}
	return c, nil
}

// Request is one build.
type Request struct {
	App string
	// AppUID is the App's metadata.uid: the build's cache is namespaced by it, so
	// that no other app's build reaches it, not even one of an app that took the
	// name of a destroyed one. Required.
	AppUID  string
	RepoDir string // the bare repository
	Commit  string // full hex object id
	NoCache bool
	// Dir is the build directory inside the repository, for monorepos ("" = root).
	Dir string
	// Dockerfile is the Dockerfile's path inside Dir ("" = Dockerfile, or a
	// generated one when there is none).
	Dockerfile string
	Target     string
	Args       map[string]string
	// CheckAppJSON, when set, is called with the commit's app.json once it is
	// read, before anything is built (not without one). Its error ends the build
	// as it is, unprinted: a refusal (a config var app.json requires that the app
	// lacks) is the caller's to say.
	CheckAppJSON func(*appjson.File) error
	// Env are the app's config vars: the predeploy step's environment (build
	// secrets, never in the image). EnvFromSecrets names the config vars whose
	// values are in Secrets, which the builder does not read: predeploy runs
	// without them, and says so.
	Env            map[string]string
	EnvFromSecrets []string
	// Slot, when set, is the caller's hold on one of its build slots, held
	// when Build is called: the builder then takes none of its own (the
	// caller's slots are the one limit). Either way the build gives its slot
	// back while it waits for the base images, and takes it again after.
	Slot *buildslot.Slot
}

// refusal is CheckAppJSON's error: returned, recorded, not printed.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// Result is a finished build.
type Result struct {
	// Image is the digest-pinned reference: <ImageRepo>/<app>@sha256:...
	Image string
	// Stack is "dockerfile" or the stack a plan detected ("go", "static", ...).
	Stack string
	// Processes are the commands of the Procfile's process types, as argv in the
	// form of the App's spec.processes (nil without a Procfile). The Procfile's
	// `release:` is not among them: it is Release.
	Processes map[string][]string
	// Release is the release command's argv: the Procfile's `release:`; nil
	// without one.
	Release []string
	// Predeploy is app.json's scripts.dokku.predeploy as the build ran it, the
	// image's last step (predeploy.go); nil without one.
	Predeploy []string
	// Postdeploy is app.json's scripts.dokku.postdeploy's argv, FirstPostdeploy
	// its scripts.postdeploy's (Heroku's, once); nil without one.
	Postdeploy, FirstPostdeploy []string
	// AppJSON is what the build directory's app.json set; nil without one.
	AppJSON *appjson.File

	// export and solve are what the build's two halves took (the commit's
	// files written out, then BuildKit's solve with the image's export and
	// unpack into containerd): "build done" logs them, for the push's profile.
	export, solve time.Duration
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Build builds req.Commit and writes progress lines to progress as they happen; the
// same lines go to the app's build log, and the build's outcome to its record when it
// ends (see Logs). It waits for a build slot first (saying so), stops when ctx ends or
// after Config.Timeout, and returns an error whose text tells the pusher what failed
// and what to do.
func (b *Builder) Build(ctx context.Context, req Request, progress io.Writer) (*Result, error) {
	if !commitRE.MatchString(req.Commit) {
		return nil, fmt.Errorf("commit %q is not a full object id", req.Commit)
	}
	if !appUIDRE.MatchString(req.AppUID) {
		return nil, fmt.Errorf("app %s: uid %q is not an App's uid; its build cache could not be kept to it", req.App, req.AppUID)
	}
	logFile, err := b.logs.create(req.App, req.Commit)
	if err != nil {
		return nil, fmt.Errorf("build log: %w", err)
	}
	defer logFile.Close()
	out := &syncWriter{w: io.MultiWriter(progress, logFile)}
	res, err := b.run(ctx, req, out)
	if werr := b.logs.finish(logFile, outcomeOf(ctx, res, err)); werr != nil {
		b.log.Warn("build outcome not recorded", "app", req.App, "commit", req.Commit, "err", werr)
	}
	return res, err
}

// outcomeOf is the record of a build that returned res and err under ctx.
func outcomeOf(ctx context.Context, res *Result, err error) outcomeRecord {
	rec := outcomeRecord{Finished: time.Now()}
	switch {
	case err == nil:
		rec.Outcome, rec.Image = OutcomeSucceeded, res.Image
	case errors.Is(ctx.Err(), context.Canceled) && errors.Is(err, context.Canceled):
		// Canceled is the caller's cancellation; a deadline, the caller's or
		// Config.Timeout, is a build that took too long: failed.
		rec.Outcome = OutcomeCanceled
	default:
		rec.Outcome, rec.Error = OutcomeFailed, headline(err)
	}
	return rec
}

// run is Build once the log is open: it waits for a slot (the caller's, or
// one of its own) and builds.
func (b *Builder) run(ctx context.Context, req Request, out io.Writer) (*Result, error) {
	if req.Slot == nil {
		own := b.slots.Slot(func() {
			fmt.Fprintf(out, "-----> Waiting for a build slot (%d builds are running)\n", b.slots.Size())
		})
		if err := own.Acquire(ctx); err != nil {
			return nil, err
		}
		defer own.Release()
		req.Slot = own
	}

	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	start := time.Now()
	buildCtx, disk := b.watchDisk(ctx)
	res, err := b.build(buildCtx, req, out)
	err = disk.done(err)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w after %s: make the build faster, or cache more of it", ErrTimeout, b.cfg.Timeout)
		}
		if !errors.As(err, new(refusal)) {
			fmt.Fprintf(out, " !     %s\n", strings.ReplaceAll(err.Error(), "\n", "\n !     "))
		}
		b.log.Info("build failed", "app", req.App, "commit", req.Commit, "err", err, "took", time.Since(start))
		return nil, err
	}
	b.log.Info("build done", "app", req.App, "commit", req.Commit, "image", res.Image, "stack", res.Stack, "took", time.Since(start),
		"export", res.export, "solve", res.solve)
	return res, nil
}

func (b *Builder) build(ctx context.Context, req Request, out io.Writer) (*Result, error) {
	work, err := os.MkdirTemp(b.cfg.WorkDir, req.App+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	lim := exportLimits{maxBytes: b.cfg.MaxContextBytes, maxFiles: b.cfg.MaxContextFiles}
	began := time.Now()
	if _, err := exportCommitCached(ctx, req.RepoDir, req.Commit, src, filepath.Join(req.RepoDir, exportCacheDir), lim); err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrContextTooLarge):
			return nil, fmt.Errorf("%w: keep large or generated files out of git, or build from a subdirectory (the app's build directory setting)", err)
		case errors.Is(err, ErrUnsafeTree):
			return nil, err
		}
		return nil, fmt.Errorf("reading commit %s: %w", req.Commit[:7], err)
	}
	exported := time.Since(began)
	srcRoot, err := os.OpenRoot(src)
	if err != nil {
		return nil, err
	}
	defer srcRoot.Close()
	ctxRoot, err := openBuildDir(srcRoot, req.Dir, req.Commit[:7])
	if err != nil {
		return nil, err
	}
	// BuildKit reads the context and the Dockerfile through these roots (fsutil's
	// os.Root file system), never through a path: nothing outside them is resolved.
	contextFS := fsutil.NewRoot(ctxRoot)
	defer contextFS.Close()

	res := &Result{Stack: "dockerfile", export: exported}
	dockerfileFS, filename, err := b.dockerfile(req, ctxRoot, work, out, res)
	if err != nil {
		return nil, err
	}
	defer dockerfileFS.Close()
	if req.CheckAppJSON != nil && res.AppJSON != nil {
		if err := req.CheckAppJSON(res.AppJSON); err != nil {
			return nil, refusal{err}
		}
	}
	if b.cfg.PlanBasesReady != "" && res.Stack != "dockerfile" && res.Stack != plan.StackStatic {
		// A generated Dockerfile builds on base images that may still be being
		// made (a static site's busybox is there before bex is up).
		if err := waitForBases(ctx, b.cfg.PlanBasesReady, req.Slot, out, basesWaitLine); err != nil {
			return nil, err
		}
	}

	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	attrs := map[string]string{"filename": filename, "image-resolve-mode": b.cfg.ImageResolveMode}
	if req.Target != "" {
		attrs["target"] = req.Target
	}
	for k, v := range req.Args {
		attrs["build-arg:"+k] = v
	}
	// After the app's arguments: these are bex's.
	tenantAttrs(attrs, b.cfg.ImageRepo, req.App, req.AppUID, out)
	policy, err := sourcePolicy(b.cfg.ImageRepo, req.App)
	if err != nil {
		return nil, err
	}
	if req.NoCache {
		attrs["no-cache"] = ""
	}
	name := fmt.Sprintf("%s/%s:%s", b.cfg.ImageRepo, req.App, req.Commit[:12])
	// Layers compressed with zstd, not gzip: BuildKit gzips with Go's
	// compress/gzip at its default level, 250–300 ms for a Go app's 6 MB binary
	// at every build that changes it (and containerd's unpack inflates it
	// again); zstd takes a tenth of that, and its fastest level (1) 50 ms less
	// than its default for that binary. containerd (1.5 on) and registries take
	// zstd layers; a layer BuildKit has cached as gzip is kept as it is.
	exportAttrs := map[string]string{"name": name, "unpack": "true", "compression": "zstd", "compression-level": "1"}
	if b.cfg.Push {
		exportAttrs["push"] = "true"
	}

	attachables, err := b.session()
	if err != nil {
		return nil, err
	}
	var pd *predeploy
	if res.Predeploy != nil {
		pd = &predeploy{command: res.AppJSON.Predeploy, argv: res.Predeploy, env: req.Env, hostname: attrs["build-arg:"+argHostname]}
		for _, name := range req.EnvFromSecrets {
			fmt.Fprintf(out, "-----> Config var %s comes from a Secret, which builds do not read: predeploy runs without it\n", oneLine(name))
		}
		attachables = append(attachables, pd.secrets())
	}
	ch := make(chan *bkclient.SolveStatus)
	r := newRenderer(out)
	var wg sync.WaitGroup
	wg.Go(func() {
		for st := range ch {
			r.update(st)
		}
	})
	var oomBefore int64
	if b.oom != nil {
		if oomBefore, err = b.oom.kills(); err != nil {
			return nil, fmt.Errorf("reading the build steps' cgroup: %w", err)
		}
	}
	opt := bkclient.SolveOpt{
		LocalMounts:  map[string]fsutil.FS{"context": fsutil.NewRootFS(contextFS), "dockerfile": fsutil.NewRootFS(dockerfileFS)},
		Exports:      []bkclient.ExportEntry{{Type: bkclient.ExporterImage, Attrs: exportAttrs}},
		Session:      attachables,
		SourcePolicy: policy,
		// BuildKit keeps the last context it received under this key and sends
		// the next one as a difference: the app's own, so that no app's build
		// starts from another's files, and two apps' builds do not take turns
		// at one copy.
		SharedKey: "bex-app-" + req.AppUID,
	}
	var resp *bkclient.SolveResponse
	solving := time.Now()
	if pd == nil {
		opt.Frontend, opt.FrontendAttrs = "dockerfile.v0", attrs
		resp, err = c.Solve(ctx, nil, opt, ch)
	} else {
		// The frontend builds inside a build function of ours, which adds the
		// predeploy step to what it built.
		resp, err = c.Build(ctx, opt, "", pd.build(attrs), ch)
	}
	wg.Wait()
	res.solve = time.Since(solving)
	if err != nil {
		if oerr := b.outOfMemory(ctx, r, oomBefore); oerr != nil {
			return nil, oerr
		}
		if ctx.Err() == nil {
			if perr := pd.predeployError(r); perr != nil {
				return nil, perr
			}
		}
		return nil, explain(ctx, err, r)
	}
	dgst := resp.ExporterResponse["containerimage.digest"]
	if !strings.HasPrefix(dgst, "sha256:") {
		return nil, fmt.Errorf("buildkitd reported no image digest")
	}
	res.Image = fmt.Sprintf("%s/%s@%s", b.cfg.ImageRepo, req.App, dgst)
	if size, err := imageSize(ctx, c, resp.ExporterResponse["containerimage.descriptor"]); err == nil {
		fmt.Fprintf(out, "-----> Built %s (%s)\n", res.Image, bytesize.Format(size))
	} else {
		b.log.Debug("image size unknown", "err", err)
		fmt.Fprintf(out, "-----> Built %s\n", res.Image)
	}
	return res, nil
}

// dockerfile decides what builds the context: the app's Dockerfile, or a plan's. It
// returns the directory that holds the Dockerfile, as a root, and its file name, and
// fills in the result's stack and process types.
func (b *Builder) dockerfile(req Request, ctxRoot *os.Root, work string, out io.Writer, res *Result) (dir fsutil.Root, filename string, err error) {
	name := req.Dockerfile
	if name == "" {
		name = "Dockerfile"
	}
	dfDir, file, found, err := findDockerfile(ctxRoot, name)
	if err != nil {
		return nil, "", err
	}
	if found {
		// An app's own Dockerfile: its Procfile's commands run through the image's
		// shell, as on Heroku.
		own := &plan.Plan{Shell: true}
		if own.Processes, err = plan.ReadProcfile(ctxRoot.FS()); err != nil {
			return nil, "", err
		}
		if err := scripts(ctxRoot, own, out, res); err != nil {
			return nil, "", err
		}
		r, err := ctxRoot.OpenRoot(dfDir)
		if err != nil {
			return nil, "", err
		}
		note, err := syntaxNote(r, file)
		if err != nil {
			r.Close()
			return nil, "", err
		}
		if note != "" {
			fmt.Fprintln(out, note)
		}
		return fsutil.NewRoot(r), file, nil
	} else if req.Dockerfile != "" {
		return nil, "", fmt.Errorf("the app's Dockerfile setting names %s, which is not in commit %s", req.Dockerfile, req.Commit[:7])
	}
	// The planner reads manifests through the build directory's root: a link can
	// lead nowhere outside it, and the planner itself refuses links that leave the
	// tree with a sentence.
	p, err := plan.Detect(ctxRoot.FS(), b.cfg.Plan)
	if err != nil {
		return nil, "", err
	}
	res.Stack = p.Stack
	if err := scripts(ctxRoot, p, out, res); err != nil {
		return nil, "", err
	}
	fmt.Fprintf(out, "-----> No Dockerfile: building it as a %s app\n", p.Stack)
	for _, note := range p.Notes {
		fmt.Fprintf(out, "       %s\n", note)
	}
	planDir := filepath.Join(work, "plan")
	if err := os.MkdirAll(planDir, 0o700); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(planDir, "Dockerfile"), []byte(p.Dockerfile), 0o600); err != nil {
		return nil, "", err
	}
	r, err := os.OpenRoot(planDir)
	if err != nil {
		return nil, "", err
	}
	return fsutil.NewRoot(r), "Dockerfile", nil
}

// outOfMemory returns ErrStepOutOfMemory, naming the failed step as the progress
// shows it, when a step failed and the steps' cgroup counted an OOM kill since the
// build began. The limit is shared by the steps of every build running at once, so a
// kill is taken as this build's only when one of its own steps failed.
func (b *Builder) outOfMemory(ctx context.Context, r *renderer, before int64) error {
	if b.oom == nil || ctx.Err() != nil {
		return nil
	}
	name, verr, _, ok := r.failedStep()
	if !ok {
		return nil
	}
	sigkill := strings.Contains(verr, "exit code: 137") || strings.Contains(verr, "signal: killed")
	if !b.oom.killedSince(before, sigkill) {
		return nil
	}
	return fmt.Errorf("%w (limit %s): %s", ErrStepOutOfMemory, bytesize.Format(b.cfg.StepMemory), name)
}

// session gives buildkitd the registry credentials, when configured. They are read
// for each build, so that a changed file takes effect without a restart.
func (b *Builder) session() ([]session.Attachable, error) {
	if b.cfg.RegistryConfig == "" {
		return nil, nil
	}
	f, err := os.Open(b.cfg.RegistryConfig)
	if err != nil {
		return nil, fmt.Errorf("registry credentials: %w", err)
	}
	defer f.Close()
	cf, err := dockerconfig.LoadFromReader(f)
	if err != nil {
		return nil, fmt.Errorf("registry credentials in %s: %w", b.cfg.RegistryConfig, err)
	}
	return []session.Attachable{authprovider.NewDockerAuthProvider(authprovider.DockerAuthProviderConfig{
		AuthConfigProvider: authprovider.LoadAuthConfig(cf),
	})}, nil
}

// imageSize adds up the compressed size of the image's config and layers, read from
// buildkitd's content store through its content API.
func imageSize(ctx context.Context, c *bkclient.Client, encodedDesc string) (int64, error) {
	raw, err := base64.StdEncoding.DecodeString(encodedDesc)
	if err != nil {
		return 0, err
	}
	var desc ocispec.Descriptor
	if err := json.Unmarshal(raw, &desc); err != nil {
		return 0, err
	}
	data, err := content.ReadBlob(ctx, contentproxy.NewContentStore(c.ContentClient()), desc)
	if err != nil {
		return 0, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return 0, err
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}

// scripts fills in the result's process types, release command and app.json
// from the build directory (the same root as the Procfile: links only while they
// stay inside it), and writes app.json's warnings to out.
func scripts(ctxRoot *os.Root, p *plan.Plan, out io.Writer, res *Result) error {
	var err error
	if res.Processes, err = processes(p); err != nil {
		return err
	}
	if _, ok := p.Processes["release"]; ok {
		if res.Release, err = p.Command("release"); err != nil {
			return err
		}
	}
	data, found, err := plan.ReadFile(ctxRoot.FS(), "app.json", appjson.MaxSize)
	if err != nil || !found {
		return err
	}
	f, err := appjson.Parse(data)
	if err != nil {
		return err
	}
	for _, w := range f.Warnings {
		fmt.Fprintf(out, "%s\n", w)
	}
	res.AppJSON = f
	if f.Predeploy != "" {
		argv, err := p.CommandLine(f.Predeploy)
		if err == nil {
			argv, err = literalArgv(argv)
		}
		if err != nil {
			return fmt.Errorf("app.json: scripts.dokku.predeploy: %v", err)
		}
		res.Predeploy = argv
	}
	if f.Postdeploy != "" {
		if res.Postdeploy, err = p.CommandLine(f.Postdeploy); err != nil {
			return fmt.Errorf("app.json: scripts.dokku.postdeploy: %v", err)
		}
	}
	if f.FirstPostdeploy != "" {
		if res.FirstPostdeploy, err = p.CommandLine(f.FirstPostdeploy); err != nil {
			return fmt.Errorf("app.json: scripts.postdeploy: %v", err)
		}
	}
	return nil
}

// processes turns a plan's Procfile entries into commands; `release:` is the
// release command, not a process type.
func processes(p *plan.Plan) (map[string][]string, error) {
	if len(p.Processes) == 0 {
		return nil, nil
	}
	out := make(map[string][]string, len(p.Processes))
	for name := range p.Processes {
		if name == "release" {
			continue
		}
		argv, err := p.Command(name)
		if err != nil {
			return nil, err
		}
		out[name] = argv
	}
	return out, nil
}

// Logs lists app's stored builds, newest first, each with its outcome: a build
// whose log has no recorded outcome is running while this Builder runs it, and
// failed with ErrorDidNotFinish once it does not (the process that ran it stopped
// during it). An app that is not a name is an error wrapping ErrInvalidName.
func (b *Builder) Logs(app string) ([]BuildLog, error) { return b.logs.List(app) }

// BuildLog returns one stored build of app, as Logs does. An unknown id is an
// error wrapping fs.ErrNotExist; an app or id that is not a name one wrapping
// ErrInvalidName.
func (b *Builder) BuildLog(app, id string) (BuildLog, error) { return b.logs.Build(app, id) }

// OpenLog opens one stored build's log text, with the errors of BuildLog.
func (b *Builder) OpenLog(app, id string) (*os.File, error) { return b.logs.open(app, id) }

// RemoveLogs deletes every stored build log and record of app (apps:destroy).
func (b *Builder) RemoveLogs(app string) error { return b.logs.remove(app) }

// LogPath is the file of one stored build log. It does not check its arguments:
// OpenLog does.
func (b *Builder) LogPath(app, id string) string {
	return filepath.Join(b.cfg.LogDir, app, filepath.Base(id)+".log")
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
