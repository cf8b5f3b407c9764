package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/pflag"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/builder"
	"bex.co/bex/builder/appjson"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/gitserver/webhook"
)

// Adapters between components: each component declares the small interface it needs,
// and only this package knows both sides.

// scheme knows Kubernetes' kinds and bex's.
func scheme() (*k8sruntime.Scheme, error) {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := appv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// pushBuilder is the builder as the pipeline sees it: it adds the App's build
// settings (spec.build) to the request.
type pushBuilder struct {
	b         *builder.Builder
	apps      client.Reader
	namespace string
}

func (p pushBuilder) Build(ctx context.Context, req pipeline.BuildRequest, progress io.Writer) (*pipeline.BuildResult, error) {
	app := &appv1.App{}
	if err := p.apps.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: req.App}, app); err != nil {
		return nil, fmt.Errorf("reading the build settings of %s: %w", req.App, err)
	}
	breq := builder.Request{
		App: req.App, AppUID: string(app.UID), RepoDir: req.RepoDir, Commit: req.Commit, NoCache: req.NoCache, Slot: req.Slot,
		Dir: app.Spec.Build.Dir, Dockerfile: app.Spec.Build.Dockerfile, Target: app.Spec.Build.Target,
	}
	if len(app.Spec.Build.Args) > 0 {
		breq.Args = map[string]string{}
		for _, a := range app.Spec.Build.Args {
			breq.Args[a.Name] = a.Value
		}
	}
	breq.CheckAppJSON = func(f *appjson.File) error { return requiredEnv(app, f) }
	// The config vars are predeploy's environment (builder/predeploy.go); the
	// ones in Secrets stay there: the gitserver reads no app's Secrets.
	for _, e := range app.Spec.Env {
		if e.ValueFrom != nil {
			breq.EnvFromSecrets = append(breq.EnvFromSecrets, e.Name)
			continue
		}
		if breq.Env == nil {
			breq.Env = map[string]string{}
		}
		breq.Env[e.Name] = e.Value
	}
	res, err := p.b.Build(ctx, breq, progress)
	if errors.Is(err, builder.ErrPredeployFailed) {
		return nil, phaseError{err: err, phase: pipeline.ErrPredeployFailed}
	}
	if err != nil {
		return nil, err
	}
	out := &pipeline.BuildResult{Image: res.Image, Processes: res.Processes, Release: res.Release, Postdeploy: res.Postdeploy, FirstPostdeploy: res.FirstPostdeploy}
	if f := res.AppJSON; f != nil {
		out.AppJSON = &pipeline.AppJSON{Formation: f.Formation, HealthCheck: f.HealthCheck, Cron: f.Cron}
		for _, e := range f.Env {
			if e.Sets() {
				out.AppJSON.Env = append(out.AppJSON.Env, pipeline.EnvDefault{Name: e.Name, Value: e.Value, Secret: e.Generator == appjson.GeneratorSecret})
			}
		}
	}
	return out, nil
}

// requiredEnv refuses a build of app whose app.json requires config vars app
// does not set (on its first deploy, app.json's own values count as set).
func requiredEnv(app *appv1.App, f *appjson.File) error {
	missing := f.MissingEnv(func(name string) bool {
		return slices.ContainsFunc(app.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == name })
	}, app.Spec.Image == "")
	if len(missing) > 0 {
		return &pipeline.MissingConfigError{App: app.Name, Names: missing}
	}
	return nil
}

// pushReleaser records a push's release through the API and waits for the
// deployer to roll it out: the pipeline's Releaser.
type pushReleaser struct{ r *releases.Recorder }

func (p pushReleaser) Release(ctx context.Context, req pipeline.ReleaseRequest) (int64, error) {
	cause := appv1.ReleaseCausePush
	switch req.Cause {
	case pipeline.CauseWebhook:
		cause = appv1.ReleaseCauseWebhook
	case pipeline.CauseDeploy:
		cause = appv1.ReleaseCauseDeploy
	case pipeline.CauseImage:
		// No code came with it: the scripts and cron jobs of the last push go
		// (Code is empty), and app.json's record is forgotten, as for a push
		// without one.
		cause = appv1.ReleaseCauseImage
	}
	// Scripts and cron come with the commit (absent ones are removed); app.json's
	// formation and health check apply with the last-applied rule, an empty one
	// when the commit has no app.json.
	code := &releases.Code{}
	if len(req.Release) > 0 || len(req.Postdeploy) > 0 || len(req.FirstPostdeploy) > 0 {
		code.Scripts = &appv1.Scripts{Release: req.Release, Postdeploy: req.Postdeploy, FirstPostdeploy: req.FirstPostdeploy}
	}
	aj := &releases.AppJSON{}
	if req.AppJSON != nil {
		code.Cron = req.AppJSON.Cron
		aj.Formation, aj.HealthCheck = req.AppJSON.Formation, req.AppJSON.HealthCheck
	}
	var firstEnv []releases.EnvDefault
	if req.AppJSON != nil {
		for _, e := range req.AppJSON.Env {
			firstEnv = append(firstEnv, releases.EnvDefault{Name: e.Name, Value: e.Value, Secret: e.Secret})
		}
	}
	n, err := p.r.Record(ctx, req.App, releases.Change{
		Image: req.Image, Commit: req.Commit, Processes: req.Processes,
		Cause: cause, Actor: req.Actor, Delivery: req.Delivery, Description: req.Description,
		Code: code, AppJSON: aj, Progress: req.Progress, FirstEnv: firstEnv,
	})
	if errors.Is(err, releases.ErrReleaseCommandFailed) {
		return 0, fmt.Errorf("%w: %w", pipeline.ErrReleaseCommandFailed, err)
	}
	return n, err
}

// The deployer's release recorder is what the backend records releases with.
var _ backend.Releases = (*releases.Recorder)(nil)
var _ backend.ReleaseCommandFailure = (*releases.ReleaseCommandError)(nil)

// hookRedeployer is the backend's Redeploy as the webhook handler calls it.
type hookRedeployer struct{ b *backend.Backend }

func (h hookRedeployer) Redeploy(ctx context.Context, r webhook.Redeploy) error {
	return h.b.Redeploy(ctx, r.App, string(r.Provider), r.Delivery)
}

// codeDeployer is the pipeline's Deploy as the backend calls it.
type codeDeployer struct{ p *pipeline.Pipeline }

func (d codeDeployer) Deploy(ctx context.Context, req backend.DeployRequest) (*backend.DeployResult, error) {
	cause := pipeline.CauseDeploy
	if req.Cause == backend.CauseWebhook {
		cause = pipeline.CauseWebhook
	}
	res, err := d.p.Deploy(ctx, pipeline.DeployRequest{App: req.App, Upstream: req.Upstream, Commit: req.Commit,
		Cause: cause, Actor: req.Actor, Delivery: req.Delivery}, nil)
	if err != nil {
		return nil, err
	}
	return &backend.DeployResult{Release: res.Release, Commit: res.Commit, URL: res.URL}, nil
}

// WaitRollout waits for release n; when it fails, the release is withdrawn so that
// the App asks again for the one that serves (releases.Recorder.Await).
func (p pushReleaser) WaitRollout(ctx context.Context, app string, n int64, progress io.Writer) (string, error) {
	url, err := p.r.Await(ctx, app, n, func(msg string) { fmt.Fprintf(progress, "       %s\n", msg) })
	if errors.Is(err, releases.ErrPostdeployFailed) {
		return "", phaseError{err: err, phase: pipeline.ErrPostdeployFailed}
	}
	return url, err
}

// Serving is the release of app that serves (0: none yet).
func (p pushReleaser) Serving(ctx context.Context, app string) (int64, error) {
	return p.r.Serving(ctx, app)
}

// phaseError is a component's error that the gitserver tells apart by its
// phase (errors.Is), with the component's text as it is.
type phaseError struct {
	err, phase error
}

func (e phaseError) Error() string        { return e.err.Error() }
func (e phaseError) Unwrap() error        { return e.err }
func (e phaseError) Is(target error) bool { return target == e.phase }

// newDirectClient reads from the API server, not from the manager's cache, for
// components that must read before the cache has started.
func newDirectClient(mgr ctrl.Manager) (client.Client, error) {
	return client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
}

// restConfig finds the API: the kubeconfig given, else $KUBECONFIG, else the
// service account of the pod bex runs in, else the kubeconfig `bex up` writes into
// the state directory.
func restConfig(kubeconfig, stateDir string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return withRate(cfg), nil
		}
		kubeconfig = filepath.Join(stateDir, "kubeconfig")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w (pass --kubeconfig or set KUBECONFIG)", kubeconfig, err)
	}
	return withRate(cfg), nil
}

// withRate lifts client-go's own request limit (5 a second, bursts of 10, when
// none is set) to the one bex up's control plane gives its clients: each push
// makes about six requests, and 8 pushes at once waited up to 1.9 s each on the
// limit to record their releases while the API server answered in 6–60 ms. The
// API server's own fairness still applies.
func withRate(cfg *rest.Config) *rest.Config {
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return cfg
}

// apiFlags are the flags of every subcommand that talks to the API.
type apiFlags struct {
	stateDir   string
	kubeconfig string
}

func (a *apiFlags) bind(f *pflag.FlagSet, stateDirUse string) {
	f.StringVar(&a.stateDir, "state-dir", defaultStateDir, stateDirUse)
	f.StringVar(&a.kubeconfig, "kubeconfig", "", "kubeconfig of the API (default: $KUBECONFIG, else the pod's service account, else STATE_DIR/kubeconfig)")
}

// connect finds the API and returns its config with bex's scheme.
func (a *apiFlags) connect() (*rest.Config, *k8sruntime.Scheme, error) {
	cfg, err := restConfig(a.kubeconfig, a.stateDir)
	if err != nil {
		return nil, nil, err
	}
	s, err := scheme()
	return cfg, s, err
}

// buildLogs are the builder's build records and logs as the backend reads them.
type buildLogs struct{ b *builder.Builder }

func (l buildLogs) List(app string) ([]backend.BuildInfo, error) {
	logs, err := l.b.Logs(app)
	if err != nil {
		return nil, err
	}
	out := make([]backend.BuildInfo, len(logs))
	for i, bl := range logs {
		out[i] = backend.BuildInfo{ID: bl.ID, Commit: bl.Commit, Time: bl.Time.UTC(), Result: string(bl.Outcome), Error: bl.Error}
	}
	return out, nil
}

func (l buildLogs) Open(app, id string) (io.ReadCloser, error) { return l.b.OpenLog(app, id) }
