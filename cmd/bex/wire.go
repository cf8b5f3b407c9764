package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/builder"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/sshcmd"
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

// pushBuilder is the builder as the gitserver sees it: it adds the App's build
// settings (spec.build) to the request.
type pushBuilder struct {
	b         *builder.Builder
	apps      client.Reader
	namespace string
}

func (p pushBuilder) Build(ctx context.Context, req gitserver.BuildRequest, progress io.Writer) (*gitserver.BuildResult, error) {
	app := &appv1.App{}
	if err := p.apps.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: req.App}, app); err != nil {
		return nil, fmt.Errorf("reading the build settings of %s: %w", req.App, err)
	}
	breq := builder.Request{
		App: req.App, RepoDir: req.RepoDir, Commit: req.Commit, NoCache: req.NoCache,
		Dir: app.Spec.Build.Dir, Dockerfile: app.Spec.Build.Dockerfile, Target: app.Spec.Build.Target,
	}
	if len(app.Spec.Build.Args) > 0 {
		breq.Args = map[string]string{}
		for _, a := range app.Spec.Build.Args {
			breq.Args[a.Name] = a.Value
		}
	}
	res, err := p.b.Build(ctx, breq, progress)
	if err != nil {
		return nil, err
	}
	return &gitserver.BuildResult{Image: res.Image, Processes: res.Processes}, nil
}

// pushDeployer records a push's release through the API and waits for the deployer
// to roll it out.
type pushDeployer struct{ r *releases.Recorder }

func (p pushDeployer) Release(ctx context.Context, req gitserver.ReleaseRequest) (int64, error) {
	cause := appv1.ReleaseCausePush
	switch req.Cause {
	case gitserver.CauseWebhook:
		cause = appv1.ReleaseCauseWebhook
	case gitserver.CauseDeploy:
		cause = appv1.ReleaseCauseDeploy
	}
	return p.r.Record(ctx, req.App, releases.Change{
		Image: req.Image, Commit: req.Commit, Processes: req.Processes,
		Cause: cause, Actor: req.Actor, Delivery: req.Delivery,
	})
}

// hookDeployer runs a webhook's redeploy as the gitserver's Deploy: the app's
// upstream is fetched when it has one, then the push's pipeline and lock.
type hookDeployer struct {
	srv       *gitserver.Server
	apps      client.Reader
	namespace string
}

func (h hookDeployer) Redeploy(ctx context.Context, r webhook.Redeploy) error {
	app := &appv1.App{}
	if err := h.apps.Get(ctx, client.ObjectKey{Namespace: h.namespace, Name: r.App}, app); err != nil {
		return err
	}
	_, err := h.srv.Deploy(ctx, gitserver.DeployRequest{
		App: r.App, Upstream: app.Spec.Git.Upstream, Cause: gitserver.CauseWebhook,
		Actor: "webhook:" + string(r.Provider), Delivery: r.Delivery,
	}, nil)
	return err
}

// WaitRollout waits for release n; when it fails, the release is withdrawn so that
// the App asks again for the one that serves (releases.Recorder.Await).
func (p pushDeployer) WaitRollout(ctx context.Context, app string, n int64, progress io.Writer) (string, error) {
	return p.r.Await(ctx, app, n, func(msg string) { fmt.Fprintf(progress, "       %s\n", msg) })
}

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
			return cfg, nil
		}
		kubeconfig = filepath.Join(stateDir, "kubeconfig")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w (pass --kubeconfig or set KUBECONFIG)", kubeconfig, err)
	}
	return cfg, nil
}

// apiFlags are the flags of every subcommand that talks to the API.
type apiFlags struct {
	stateDir   string
	kubeconfig string
}

func (a *apiFlags) bind(f *pflag.FlagSet, stateDirUse string) {
	f.StringVar(&a.stateDir, "state-dir", "/var/lib/bex", stateDirUse)
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

// buildLogs are the builder's stored build logs as the ssh commands read them.
type buildLogs struct{ b *builder.Builder }

func (l buildLogs) List(app string) ([]sshcmd.Build, error) {
	logs, err := l.b.Logs(app)
	if err != nil {
		return nil, err
	}
	out := make([]sshcmd.Build, len(logs))
	for i, bl := range logs {
		out[i] = sshcmd.Build{ID: bl.ID, Commit: bl.Commit, Time: bl.Time}
	}
	return out, nil
}

func (l buildLogs) Open(app, id string) (io.ReadCloser, error) { return os.Open(l.b.LogPath(app, id)) }

// runtimeLogs reads the local runtime's log files from the state directory the
// deployer shares with this process (`bex deployer --runtime local` on the same
// machine). With the Kubernetes runtime the logs are the cluster's.
type runtimeLogs struct {
	runtime   string
	stateDir  string // the local runtime's, STATE_DIR/runtime
	namespace string
}

func (l runtimeLogs) Logs(ctx context.Context, app string, o sshcmd.LogOptions, w io.Writer) error {
	if l.runtime == "kubernetes" {
		return fmt.Errorf("on a cluster, read the logs with: kubectl logs -n %s -l %s=%s --prefix", l.namespace, releases.LabelApp, app)
	}
	return local.ReadLogs(ctx, l.stateDir, types.NamespacedName{Namespace: l.namespace, Name: app},
		local.LogOptions{Follow: o.Follow, Lines: o.Lines, Process: o.Process}, w)
}

// agentDeployer is the gitserver's Deploy as the agents' API sees it: the deploy
// branch (fetched from the app's upstream when it has one) or a given commit.
type agentDeployer struct {
	srv       *gitserver.Server
	apps      client.Reader
	namespace string
}

func (d agentDeployer) Deploy(ctx context.Context, name, commit, actor string) (*gitserver.DeployResult, error) {
	app := &appv1.App{}
	if err := d.apps.Get(ctx, client.ObjectKey{Namespace: d.namespace, Name: name}, app); err != nil {
		return nil, err
	}
	req := gitserver.DeployRequest{App: name, Commit: commit, Cause: gitserver.CauseDeploy, Actor: actor}
	if commit == "" {
		req.Upstream = app.Spec.Git.Upstream
	}
	return d.srv.Deploy(ctx, req, nil)
}

// agentLogs and agentBuilds are the runtime and build logs as the agents' API
// reads them: the same sources as the ssh commands'.
type agentLogs struct{ runtimeLogs }

func (l agentLogs) Tail(ctx context.Context, app, process string, lines int, w io.Writer) error {
	return l.Logs(ctx, app, sshcmd.LogOptions{Lines: lines, Process: process}, w)
}

type agentBuilds struct{ buildLogs }

func (b agentBuilds) List(app string) ([]mcpserver.Build, error) {
	list, err := b.buildLogs.List(app)
	out := make([]mcpserver.Build, len(list))
	for i, x := range list {
		out[i] = mcpserver.Build{ID: x.ID, Commit: x.Commit, Time: x.Time}
	}
	return out, err
}
