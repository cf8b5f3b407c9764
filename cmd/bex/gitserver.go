package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/builder"
	"bex.co/bex/builder/imageimport"
	"bex.co/bex/builder/plan"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/dbbackups"
	"bex.co/bex/gitserver/hooksecrets"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/gitserver/sshcmd"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/gitserver/upstream"
	"bex.co/bex/gitserver/webhook"
	"bex.co/bex/internal/clientaddr"
)

// gitserverCmd runs the SSH git endpoint against an existing Kubernetes API and
// buildkitd: pushes build, record a release and wait for the deployer to roll it out.
type gitserverCmd struct {
	errOut io.Writer
	log    *slog.Logger

	apiFlags
	sshAddr          string
	namespace        string
	secretsNamespace string
	buildkitAddr     string
	buildkitTLS      builder.TLSConfig
	imageRepo        string
	push             bool
	registryConfig   string
	imageResolveMode string
	runtime          string
	hostUsers        bool
	allowEgress      egressFlag
	// volumeHelperImage is bex's own image, for the helper pods of volumes'
	// backups and restores on a cluster.
	volumeHelperImage string
	containerdAddr    string
	containerdNS      string
	// images pulls deploy:image's images; nil: deploy:image says it is off.
	images       imageImporter
	sshURL       string
	baseDomain   string
	adminKeys    []string
	hooksAddr    string
	hooksURL     string
	allowFile    bool
	allowPrivate bool
	// allowPrivateRegistries lets deploy:image pull from registries on
	// loopback, private and link-local addresses.
	allowPrivateRegistries bool
	registryInsecure       bool
	trustedProxies         []string
	proxySecretFile        string
	maxObjectSize          byteSize
	maxPushObjects         int64
	minFreeDisk            byteSize
	buildMemory            byteSize
	buildCgroup            string
	planImages             plan.Images
	planBasesReady         string
	edgeStats              string

	// ready, when set, receives the listen address once the server accepts;
	// hooksReady the HTTP address of the hooks.
	ready      chan<- string
	hooksReady chan<- string
	listener   net.Listener
	cancel     context.CancelFunc
	// registry receives the metrics; default prometheus.DefaultRegisterer (tests
	// that run two servers in one process give each its own).
	registry prometheus.Registerer
}

func (c *gitserverCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gitserver",
		Short: "Serve git push and clone over SSH",
		Long: "gitserver takes pushes over SSH, builds them with buildkitd, records a release in the\n" +
			"App API and waits for the deployer to roll it out before the branch moves.\n" +
			"Every flag can also be set as BEX_<FLAG>, e.g. BEX_SSH_ADDR.",
		Args:    cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) },
	}
	f := cmd.Flags()
	c.apiFlags.bind(f, "directory for the host key, repositories and build logs")
	f.StringVar(&c.sshAddr, "ssh-addr", gitserver.DefaultConfig().Addr, "SSH listen address")
	f.StringVar(&c.namespace, "namespace", access.DefaultNamespace, "namespace of the Apps")
	f.StringVar(&c.secretsNamespace, "secrets-namespace", "", "namespace of the webhook secrets and the agents' tokens, the only Secrets the gitserver touches (default: --namespace; on a cluster a namespace of its own, bex-gitserver, so that it needs no access to the apps' Secrets nor the edge's)")
	f.StringVar(&c.buildkitAddr, "buildkit-addr", "", "buildkitd address (default: unix://STATE_DIR/buildkitd/buildkitd.sock)")
	f.StringVar(&c.buildkitTLS.CA, "buildkit-tls-ca", "", "CA certificate (PEM) that buildkitd's server certificate must chain to, for mutual TLS with a tcp:// --buildkit-addr (a cluster, where buildkitd takes only clients with a certificate of its CA)")
	f.StringVar(&c.buildkitTLS.Cert, "buildkit-tls-cert", "", "client certificate (PEM) presented to buildkitd, issued by the CA of buildkitd's --tlscacert; with --buildkit-tls-key")
	f.StringVar(&c.buildkitTLS.Key, "buildkit-tls-key", "", "key (PEM) of --buildkit-tls-cert")
	f.StringVar(&c.buildkitTLS.ServerName, "buildkit-tls-server-name", "", "name buildkitd's certificate must hold (default: the host of --buildkit-addr)")
	f.StringVar(&c.imageRepo, "image-repo", defaultImageRepo, "repository that names the built images")
	f.BoolVar(&c.push, "push", false, "push the built images to --image-repo's registry (a cluster, where nodes pull them) instead of keeping them in buildkitd's containerd")
	f.StringVar(&c.registryConfig, "registry-config", "", "Docker-style config.json with the credentials for pushing and for private base images (default: anonymous)")
	f.StringVar(&c.imageResolveMode, "image-resolve-mode", builder.DefaultConfig().ImageResolveMode, "how base images are found: default, pull, or local (no registry)")
	f.StringVar(&c.runtime, "runtime", "local", "the deployer's runtime, for the logs command: local (read from STATE_DIR/runtime) or kubernetes")
	f.BoolVar(&c.hostUsers, "host-users", false, "kubernetes runtime: run one-off pods (run, the release phase) in the node's user namespace, as the deployer's --host-users does for the app's pods")
	f.StringVar(&c.volumeHelperImage, "volume-helper-image", "", "kubernetes runtime: bex's own image (the one this gitserver runs), which the helper pods of volumes:backup and volumes:restore run; empty: those commands are off on a cluster")
	f.StringVar(&c.containerdAddr, "containerd-addr", "", "containerd socket of the local runtime, where the images are, for system:df and system:prune (default: STATE_DIR/containerd/containerd.sock)")
	f.Var(&c.allowEgress, "allow-tenant-egress", "local runtime, for the one-offs (run, release commands): "+egressUsage+"; give the deployer the same")
	f.StringVar(&c.containerdNS, "containerd-namespace", defaultContainerdNamespace, "containerd namespace of the local runtime (the one buildkitd builds into)")
	f.StringSliceVar(&c.adminKeys, "admin-keys", nil, "OpenSSH public key files whose keys the user admin holds, made sure of at every start (BEX_ADMIN_KEYS=a.pub,b.pub)")
	f.StringVar(&c.baseDomain, "base-domain", backend.DefaultConfig().BaseDomain, "apps answer at <app>.<base-domain> (as the deployer and the edge have it): domains:add refuses members names under it and in its registered domain")
	f.StringVar(&c.sshURL, "ssh-url", "", "how users reach this server, for the hints commands print (default ssh://git@HOST:PORT)")
	f.StringVar(&c.hooksAddr, "hooks-addr", "", "HTTP address of the webhooks (POST /hooks/<app>) and the agents' MCP endpoint (/mcp); empty: off")
	f.StringVar(&c.hooksURL, "hooks-url", "", "how git hosts reach the webhooks, for `webhooks APP` (default http://HOOKS-ADDR)")
	c.maxObjectSize = pipeline.DefaultMaxObjectBytes
	f.Var(&c.maxObjectSize, "max-object-size", "largest object (a file, mostly) that a push or an upstream fetch may hold, checked before it is inflated (GitHub's limit is 100MiB); it also bounds the gitserver's memory")
	f.Int64Var(&c.maxPushObjects, "max-push-objects", pipeline.DefaultMaxPushObjects, "most objects a push (or an upstream fetch) may hold, refused from its pack's header before any object is read; the gitserver holds about 90 bytes an object of a push, 170 MiB at the default (larger histories are pushed in parts)")
	c.minFreeDisk = pipeline.DefaultMinFreeBytes
	f.Var(&c.minFreeDisk, "min-free-disk", fmt.Sprintf("free space kept on the file system of --state-dir: with less free (this or %d%% of the file system, whichever is smaller) pushes and deploys are refused at once, saying how much is free", pipeline.DefaultMinFreePercent))
	f.Var(&c.buildMemory, "build-memory", "the memory limit of build steps, as set on --build-cgroup (e.g. 4Gi), named when a step is killed by it")
	f.StringVar(&c.buildCgroup, "build-cgroup", "", "directory of the cgroup buildkitd runs build steps under (bex up sets it); its OOM counters tell a step killed by --build-memory; empty: a step killed for memory is reported by its exit code")
	pi := plan.DefaultConfig().Images
	f.StringVar(&c.planImages.Go, "plan-image-go", pi.Go, "base image a Go app without a Dockerfile is compiled on")
	f.StringVar(&c.planImages.Node, "plan-image-node", pi.Node, "base image a Node app without a Dockerfile builds and runs on (it must have a node user)")
	f.StringVar(&c.planImages.Python, "plan-image-python", pi.Python, "base image a Python app without a Dockerfile installs into and runs on")
	f.StringVar(&c.planImages.Static, "plan-image-static", pi.Static, "base image that serves a static site without a Dockerfile (busybox's httpd)")
	f.StringVar(&c.planImages.Runtime, "plan-image-runtime", pi.Runtime, "base image a compiled Go binary runs on (no shell needed)")
	f.StringVar(&c.planImages.Stack, "plan-image-stack", pi.Stack, "base image of an app with only a Procfile, as Heroku's stack (needs /bin/sh; python3, perl, ruby, curl, git for the Procfile's commands)")
	f.StringVar(&c.planImages.Ruby, "plan-image-ruby", pi.Ruby, "base image a Ruby app without a Dockerfile installs its gems into (bundle) and runs on (GEM_HOME as the official image's)")
	f.StringVar(&c.planImages.PHP, "plan-image-php", pi.PHP, "base image a PHP app without a Dockerfile runs on (php and its CLI server)")
	f.StringVar(&c.planImages.Composer, "plan-image-composer", pi.Composer, "image that installs a PHP app's composer.json dependencies (composer), in a build stage of its own")
	f.StringVar(&c.planBasesReady, "plan-bases-ready", "", "a file that appears when the plans' base images are ready (empty) or could not be made (why): builds without a Dockerfile wait for it (bex up --local-bases makes them in the background)")
	var trusted []string
	for _, p := range webhook.DefaultConfig().TrustedProxies {
		trusted = append(trusted, p.String())
	}
	f.StringSliceVar(&c.trustedProxies, "hooks-trusted-proxies", trusted, "addresses or CIDRs of the proxies (bex's edge) whose X-Forwarded-For names the source of a webhook delivery or MCP request, for the limits on bad signatures and failed tokens per source")
	f.StringVar(&c.proxySecretFile, "hooks-proxy-secret-file", "", "file holding the secret bex's edge sends in X-Bex-Edge-Secret (its --platform-secret-file): a request with it is a trusted proxy's, from any address (a cluster, where the edge's address is no better than a tenant pod's); empty: only --hooks-trusted-proxies are")
	f.StringVar(&c.edgeStats, "edge-stats", "", "the edge's --stats-addr (unix:PATH or host:port), where metrics and the agents' diagnose read the apps' request figures; empty: they say this server has no edge figures")
	f.BoolVar(&c.allowFile, "allow-file-upstreams", false, "let webhooks fetch file:// upstreams (a file:// URL can name any repository on this machine, another app's too)")
	f.BoolVar(&c.allowPrivateRegistries, "allow-private-registries", false, "let deploy:image pull from registries on loopback, private (RFC 1918, CGNAT 100.64/10, ULA), link-local and metadata addresses, e.g. a registry on the LAN (off: a member could make this server reach the platform's listeners, the LAN or the cloud's metadata service)")
	f.BoolVar(&c.registryInsecure, "registry-insecure", false, "with --push: speak plain HTTP to --image-repo's registry (bex's own, inside the cluster) when deploy:image copies an image into it")
	f.BoolVar(&c.allowPrivate, "allow-private-upstreams", false, "let apps fetch upstreams on loopback, private (RFC 1918, CGNAT 100.64/10, ULA), link-local and metadata addresses, e.g. a Gitea on the LAN (off: a member could make this server reach the API server, the LAN or the cloud's metadata service)")
	return cmd
}

func (c *gitserverCmd) run(ctx context.Context) error {
	ctx, c.cancel = context.WithCancel(ctx)
	if c.secretsNamespace == "" {
		c.secretsNamespace = c.namespace
	}
	restCfg, kc, dir, informers, err := c.startAPI(ctx)
	if err != nil {
		return err
	}
	pcfg := c.pipelineConfig()
	b, err := builder.New(c.builderConfig(pcfg), c.log)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Preflight(ctx); err != nil {
		return err
	}

	kind, ok := runtimeNamed(c.runtime)
	if !ok {
		return fmt.Errorf("--runtime %q: use local or kubernetes", c.runtime)
	}
	recorder := &releases.Recorder{Client: kc, Namespace: c.namespace, PollInterval: 50 * time.Millisecond}
	tokenStore := &tokens.Store{Client: kc, Users: informers, Namespace: c.secretsNamespace}
	// The pipeline is the bottom layer: the backend's deploys and the SSH
	// server's pushes both run through it. Each app fetches its ssh upstreams
	// with its own deploy key, kept with the webhook secrets.
	pl, err := pipeline.New(pcfg, dir, pushBuilder{b: b, apps: kc, namespace: c.namespace}, pushReleaser{recorder}, c.log, c.metricsRegistry(),
		pipeline.WithUpstreamAuth(&hooksecrets.Upstreams{Client: kc, Namespace: c.namespace, SecretsNamespace: c.secretsNamespace}))
	if err != nil {
		return err
	}
	rt, err := kind.gitserver(c, gitserverEnv{restCfg: restCfg, kc: kc, apps: informers, repos: pl, builder: b})
	if err != nil {
		return err
	}
	defer rt.close()
	// Listening before the commands are made, so that `webhooks APP` can print
	// the address the port 0 of a test became.
	hooksListener, err := c.listenHooks()
	if err != nil {
		return err
	}
	if hooksListener != nil {
		defer hooksListener.Close()
	}
	bk := c.backendConfig(kc, informers, recorder, pl, b)
	bk.Logs, bk.Tokens = rt.logs, tokenStore
	bk.Volumes, bk.Storage = rt.volumes, rt.storage
	bk.ConfigSecrets = rt.configSecrets
	if bk.Traffic, err = edgeTrafficFrom(c.edgeStats); err != nil {
		return fmt.Errorf("--edge-stats: %w", err)
	}
	if bk.Certificates, err = edgeCertificatesFrom(c.edgeStats); err != nil {
		return fmt.Errorf("--edge-stats: %w", err)
	}
	// deploy:image: the image goes where a build's would, into containerd
	// (one machine) or the cluster's registry (--push).
	icfg := imageimport.DefaultConfig()
	icfg.ImageRepo, icfg.Namespace = c.imageRepo, c.containerdNS
	icfg.Blocked = registryBlocked(c.allowPrivateRegistries)
	icfg.Credentials = &hooksecrets.Registries{Client: kc, Namespace: c.secretsNamespace}
	if c.push {
		icfg.Push, icfg.PushKeychain, icfg.PushInsecure = true, kube.ConfigKeychain(c.registryConfig), c.registryInsecure
	} else if rt.images != nil {
		// The margin pushes are refused under, kept while the image is pulled.
		icfg.DiskDir, icfg.MinFreeBytes, icfg.MinFreePercent = c.stateDir, pcfg.MinFreeBytes, pcfg.MinFreePercent
		icfg.Containerd = rt.images
	}
	if icfg.Push || icfg.Containerd != nil {
		im, err := imageimport.New(icfg)
		if err != nil {
			return err
		}
		c.images = imageImporter{im}
		bk.Images = imageDeployer{p: pl, images: c.images}
		bk.Registries = c.images
	}
	if rt.oneOffs != nil {
		bk.Runner = oneOffRunner{rt.oneOffs}
		// The release command and postdeploy scripts run as one-offs too.
		recorder.OneOffs = rt.oneOffs
	}
	// Postgres backups kept on this server, beside the repositories, under the
	// same floor of free space as pushes.
	bk.Backups = &dbbackups.Store{Dir: filepath.Join(c.stateDir, "database-backups"), MinFreeBytes: uint64(pl.Config().MinFreeBytes)}
	// The audit trail, beside the repositories: on a cluster, the gitserver's
	// volume. Bounded by its defaults (90 days, 100,000 changes).
	trail, err := openAudit(ctx, filepath.Join(c.stateDir, "audit"), c.log)
	if err != nil {
		return fmt.Errorf("opening the audit trail: %w", err)
	}
	defer trail.Close()
	bk.Audit = trail
	// diagnose says whether the disk is short, as a push would be told.
	bk.DiskCheck = func() error { return pl.CheckDisk("push or deploy again") }
	be, err := backend.New(bk)
	if err != nil {
		return err
	}
	if sched := be.BackupSchedules(); sched != nil {
		go sched.Run(ctx)
	}
	cmds, err := sshcmd.New(sshcmd.Config{Backend: be})
	if err != nil {
		return err
	}
	gcfg := gitserver.DefaultConfig()
	gcfg.StateDir, gcfg.Addr = c.stateDir, c.sshAddr
	srv, err := gitserver.New(gcfg, dir, be, pl, c.log, c.metricsRegistry(), gitserver.WithCommands(cmds))
	if err != nil {
		return err
	}
	return c.serve(ctx, srv, pl, hooksListener, be)
}

// backendConfig is the backend's configuration on the API, the pipeline (its
// deploys, the repositories) and the builder (its logs); the runtime's parts
// are added by run.
func (c *gitserverCmd) backendConfig(kc client.Client, informers client.Reader, recorder *releases.Recorder, pl *pipeline.Pipeline, b *builder.Builder) backend.Config {
	bk := backend.DefaultConfig()
	bk.Client, bk.Reader, bk.Namespace, bk.SecretsNamespace = kc, informers, c.namespace, c.secretsNamespace
	bk.Releases, bk.BaseDomain = recorder, c.baseDomain
	bk.Deployer = codeDeployer{pl}
	bk.Builds = buildLogs{b}
	bk.RemoveRepository = func(ctx context.Context, app string) error { return pl.RemoveRepository(ctx, app, 10*time.Second) }
	bk.RemoveBuildLogs = b.RemoveLogs
	bk.UpstreamPolicy = upstream.Policy{AllowPrivate: c.allowPrivate, AllowFile: c.allowFile}
	bk.HooksURL, bk.RolloutTimeout, bk.Log = c.hooksURL, pl.Config().RolloutTimeout, c.log
	if c.sshURL != "" {
		bk.Host = c.sshURL
	}
	return bk
}

// startAPI connects to the API, starts the directory's cache and makes sure
// of --admin-keys, saying when there is no admin yet.
func (c *gitserverCmd) startAPI(ctx context.Context) (*rest.Config, client.Client, *access.Kube, cache.Cache, error) {
	restCfg, s, err := c.connect()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	// A client that watches: a push waits on its App's status
	// (releases.Recorder.Wait) by watching it, not by reading it on a timer.
	kc, err := client.NewWithWatch(restCfg, client.Options{Scheme: s})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	acfg := access.DefaultConfig()
	acfg.Namespace = c.namespace
	dir, informers, err := access.Start(ctx, acfg, restCfg, s)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := ensureAdminKeys(ctx, kc, c.adminKeys); err != nil {
		return nil, nil, nil, nil, err
	}
	if ok, err := backend.HasAdmin(ctx, kc); err == nil && !ok {
		say(c.errOut, c.log, "bex gitserver: no admin yet: run `bex users add NAME --admin --key ~/.ssh/id_ed25519.pub` on this machine, or start with --admin-keys FILE")
	}
	return restCfg, kc, dir, informers, nil
}

// serve serves SSH (and, with hooksListener, the webhooks and the agents'
// API) until ctx ends or a listener fails, then shuts the front-ends down
// before the pipeline they run on.
func (c *gitserverCmd) serve(ctx context.Context, srv *gitserver.Server, pl *pipeline.Pipeline, hooksListener net.Listener, be *backend.Backend) error {
	var err error
	c.listener, err = net.Listen("tcp", c.sshAddr)
	if err != nil {
		return err
	}
	say(c.errOut, c.log, "bex gitserver: listening on %s (host key %s)", c.listener.Addr(), gossh.FingerprintSHA256(srv.HostKey()))
	if c.ready != nil {
		c.ready <- c.listener.Addr().String()
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(c.listener) }()
	var hooks *hooksServer
	if hooksListener != nil {
		if hooks, err = c.serveHooks(hooksListener, be, errc); err != nil {
			return err
		}
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelShutdown()
	// Deliveries are answered at once; the redeploys they started run on under
	// the pipeline's lock and are waited for like background pushes.
	hooks.shutdown(shutdown)
	err = srv.Shutdown(shutdown)
	pl.Shutdown(shutdown)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// pipelineConfig is the pipeline's configuration from the flags: the one
// owner of the disk margin, the build slots and the build's timeout, which the
// builder and deploy:image's importer are given from it.
func (c *gitserverCmd) pipelineConfig() pipeline.Config {
	pcfg := pipeline.DefaultConfig()
	pcfg.StateDir = c.stateDir
	pcfg.AllowFileUpstreams, pcfg.AllowPrivateUpstreams = c.allowFile, c.allowPrivate
	pcfg.MaxObjectBytes = int64(c.maxObjectSize)
	pcfg.MaxPushObjects = c.maxPushObjects
	pcfg.MinFreeBytes = int64(c.minFreeDisk)
	return pcfg
}

// builderConfig is the builder's configuration from the flags, with the
// pipeline's build timeout and disk margin: a running build keeps the margin
// pushes are refused under. Each build is handed its hold on one of the
// pipeline's build slots (pipeline.BuildRequest.Slot), so the builder's own
// slots, sized alike, are never taken.
func (c *gitserverCmd) builderConfig(pcfg pipeline.Config) builder.Config {
	bcfg := builder.DefaultConfig()
	// An empty --buildkit-addr is derived from the state dir.
	bcfg.StateDir, bcfg.Address = c.stateDir, c.buildkitAddr
	bcfg.TLS = c.buildkitTLS
	bcfg.ImageRepo = c.imageRepo
	bcfg.Push, bcfg.RegistryConfig = c.push, c.registryConfig
	bcfg.ImageResolveMode = c.imageResolveMode
	bcfg.StepMemory = int64(c.buildMemory)
	bcfg.StepCgroup = c.buildCgroup
	bcfg.MaxConcurrent, bcfg.Timeout = pcfg.MaxConcurrentBuilds, pcfg.BuildTimeout
	bcfg.MinFreeBytes, bcfg.MinFreePercent = pcfg.MinFreeBytes, pcfg.MinFreePercent
	bcfg.Plan.Images = c.planImages
	bcfg.PlanBasesReady = c.planBasesReady
	return bcfg
}

// listenHooks listens on --hooks-addr (nil without one) and fills in
// --hooks-url from the address it got.
func (c *gitserverCmd) listenHooks() (net.Listener, error) {
	if c.hooksAddr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", c.hooksAddr)
	if err != nil {
		return nil, fmt.Errorf("--hooks-addr: %w", err)
	}
	if c.hooksURL == "" {
		c.hooksURL = "http://" + l.Addr().String()
	}
	return l, nil
}

// hooksServer is the HTTP front-ends beside the SSH server: the webhooks and
// the agents' MCP endpoint.
type hooksServer struct {
	http  *http.Server
	hooks *webhook.Handler
}

// serveHooks serves the webhooks and the agents' API on l, sending a failure
// to serve on errc.
func (c *gitserverCmd) serveHooks(l net.Listener, be *backend.Backend, errc chan<- error) (*hooksServer, error) {
	wcfg := webhook.DefaultConfig()
	var err error
	if wcfg.TrustedProxies, err = clientaddr.Parse(strings.Join(c.trustedProxies, ",")); err != nil {
		return nil, fmt.Errorf("--hooks-trusted-proxies: %w", err)
	}
	if c.proxySecretFile != "" {
		if wcfg.ProxySecret, err = clientaddr.ReadSecret(c.proxySecretFile); err != nil {
			return nil, fmt.Errorf("--hooks-proxy-secret-file: %w", err)
		}
	}
	hooks, err := webhook.New(wcfg, be, hookRedeployer{be}, c.log)
	if err != nil {
		return nil, err
	}
	mcfg := mcpserver.DefaultConfig()
	mcfg.Backend, mcfg.Version, mcfg.Log, mcfg.TrustedProxies, mcfg.ProxySecret = be, version, c.log, wcfg.TrustedProxies, wcfg.ProxySecret
	agents, err := mcpserver.New(mcfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/hooks/", hooks)
	mux.Handle("/mcp", agents.Handler())
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelWarn)}
	go func() {
		if err := httpSrv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	say(c.errOut, c.log, "bex gitserver: webhooks and the agents' API on %s (%s/hooks/APP, %s/mcp)", l.Addr(), c.hooksURL, c.hooksURL)
	if c.hooksReady != nil {
		c.hooksReady <- l.Addr().String()
	}
	return &hooksServer{http: httpSrv, hooks: hooks}, nil
}

// shutdown stops taking requests and waits for the redeploys the deliveries
// started (or ctx); nothing to do without hooks.
func (h *hooksServer) shutdown(ctx context.Context) {
	if h == nil {
		return
	}
	_ = h.http.Shutdown(ctx)
	_ = h.hooks.Close(ctx)
}

func (c *gitserverCmd) metricsRegistry() prometheus.Registerer {
	if c.registry != nil {
		return c.registry
	}
	return prometheus.DefaultRegisterer
}

func (c *gitserverCmd) close() error {
	if c.cancel != nil {
		c.cancel()
	}
	return nil
}

// openAudit opens the audit trail in dir. While another gitserver has it (a
// rolling update's old pod, which still serves until it is stopped) it waits
// for it, up to two minutes, rather than failing to start.
func openAudit(ctx context.Context, dir string, log *slog.Logger) (*audit.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for said := false; ; said = true {
		s, err := audit.Open(audit.DefaultOptions(dir))
		if !errors.Is(err, audit.ErrInUse) {
			return s, err
		}
		if !said {
			log.Info("waiting for the gitserver that has the audit trail open to stop", "dir", dir)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-t.C:
		}
	}
}
