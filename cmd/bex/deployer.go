package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"bex.co/bex/deployer"
	"bex.co/bex/deployer/databases"
	"bex.co/bex/deployer/databases/cluster"
	"bex.co/bex/deployer/runtime/local"
)

// deployerCmd runs the App reconciler ("bex-api") with a runtime: containerd on this
// host, or Deployments on a cluster.
type deployerCmd struct {
	errOut io.Writer
	log    *slog.Logger
	// inProcessAgain lets a test start a second deployer in its process:
	// controller-runtime refuses a controller name it registered before (for
	// its metrics), which a real process never does twice.
	inProcessAgain bool

	apiFlags
	namespace        string
	runtimeName      string
	hostUsers        bool
	allowEgress      egressFlag
	volumeClass      string
	containerdAddr   string
	containerdNS     string
	baseDomain       string
	httpsPort        int
	keepReleases     int
	imageRepo        string
	registryDelete   bool
	registryInsecure bool
	registryConfig   string
	leaderElect      bool
	leaderElectNS    string
	metricsAddr      string
	metricsSecure    bool
	healthAddr       string
	postgresImage    string
	redisImage       string
	// The kubernetes runtime's Postgres: CloudNativePG's operand image and
	// the uid and gid of its postgres user.
	clusterPostgresImage string
	clusterPostgresUID   int64
	clusterPostgresGID   int64

	closeRuntime func() error
}

func (c *deployerCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deployer",
		Short: "Run the App controller: make each App's release run, and report what serves",
		Long: "deployer reconciles Apps into running processes with a runtime: local (containerd on\n" +
			"this host, one node) or kubernetes (a Deployment per process type). Every flag can also\n" +
			"be set as BEX_<FLAG>, e.g. BEX_RUNTIME.",
		Args:    cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) },
	}
	f := cmd.Flags()
	c.apiFlags.bind(f, "directory for the local runtime's ports and logs")
	f.StringVar(&c.namespace, "namespace", "", "only reconcile Apps of this namespace (default: all)")
	f.StringVar(&c.runtimeName, "runtime", "local", "where processes run: local (containerd on this host) or kubernetes")
	f.StringVar(&c.containerdAddr, "containerd-addr", "", "containerd socket for the local runtime (default: STATE_DIR/containerd/containerd.sock)")
	f.StringVar(&c.containerdNS, "containerd-namespace", local.DefaultNamespace, "containerd namespace of the local runtime")
	f.StringVar(&c.volumeClass, "volume-storage-class", "", "kubernetes runtime: the StorageClass of the apps' volumes (PersistentVolumeClaims); default the cluster's default class")
	f.BoolVar(&c.hostUsers, "host-users", false, "kubernetes runtime: run app pods in the node's user namespace (hostUsers: true), for nodes without user-namespace support; by default each pod gets its own")
	f.Var(&c.allowEgress, "allow-tenant-egress", "local runtime: "+egressUsage+"; give the gitserver and buildkitd's installer (bex up) the same")
	f.StringVar(&c.baseDomain, "base-domain", deployer.DefaultConfig().BaseDomain, "apps answer at <app>.<base-domain>")
	f.IntVar(&c.httpsPort, "https-port", deployer.DefaultConfig().HTTPSPort, "the edge's HTTPS port, shown in app URLs when not 443")
	f.IntVar(&c.keepReleases, "keep-releases", deployer.DefaultConfig().KeepReleases, "releases kept per app (the current one is never pruned)")
	f.StringVar(&c.imageRepo, "image-repo", defaultImageRepo, "repository the gitserver's --image-repo names the built images under: the images of pruned releases and deleted apps named <image-repo>/<app> are removed (from containerd; from the registry with --registry-delete), and no others")
	f.BoolVar(&c.registryDelete, "registry-delete", false, "kubernetes runtime: delete the manifests of pruned releases and deleted apps from --image-repo's registry (it must allow deletes; its garbage collection frees the blobs)")
	f.BoolVar(&c.registryInsecure, "registry-insecure", false, "kubernetes runtime: speak plain HTTP to --image-repo's registry (bex's own, inside the cluster)")
	f.StringVar(&c.registryConfig, "registry-config", "", "kubernetes runtime: Docker-style config.json with the registry's credentials for --registry-delete (default: anonymous)")
	f.BoolVar(&c.leaderElect, "leader-elect", false, "elect a leader, for several deployer replicas on a cluster")
	f.StringVar(&c.leaderElectNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: --namespace, else default)")
	f.StringVar(&c.metricsAddr, "metrics-addr", "127.0.0.1:9091", "Prometheus metrics address (0 turns it off)")
	f.BoolVar(&c.metricsSecure, "metrics-secure", false, "serve the metrics over HTTPS (a self-signed certificate) to callers with a Kubernetes bearer token allowed to GET the non-resource URL /metrics (a TokenReview and a SubjectAccessReview per caller, cached); for a cluster, where every pod reaches the deployer's pod")
	f.StringVar(&c.postgresImage, "postgres-image", databases.DefaultConfig().Postgres.Ref, "local runtime: the image managed Postgres databases run (the official image's behaviour: docker-entrypoint.sh, POSTGRES_PASSWORD); its tag is the version offered")
	f.StringVar(&c.redisImage, "redis-image", databases.DefaultConfig().Redis.Ref, "the image managed Redis databases run, on both runtimes (the official image's behaviour: docker-entrypoint.sh drops root); its tag is the version offered")
	f.StringVar(&c.clusterPostgresImage, "cluster-postgres-image", cluster.DefaultConfig().Postgres.Ref, "kubernetes runtime: CloudNativePG's operand image managed Postgres databases run (its Clusters' imageName, with psql and pg_dump); its tag is the version offered")
	f.Int64Var(&c.clusterPostgresUID, "cluster-postgres-uid", cluster.DefaultPostgresUID, "kubernetes runtime: the uid of the postgres user in --cluster-postgres-image")
	f.Int64Var(&c.clusterPostgresGID, "cluster-postgres-gid", cluster.DefaultPostgresUID, "kubernetes runtime: the gid of the postgres user in --cluster-postgres-image")
	f.StringVar(&c.healthAddr, "health-addr", "127.0.0.1:9092", "health and readiness probes address, or unix:PATH for a socket only root reaches (0 turns it off)")
	return cmd
}

func (c *deployerCmd) run(ctx context.Context) error {
	restCfg, s, err := c.connect()
	if err != nil {
		return err
	}
	healthSocket, unixHealth := strings.CutPrefix(c.healthAddr, "unix:")
	probeAddr := c.healthAddr
	if unixHealth {
		probeAddr = "0" // served below, on the socket
	}
	opts := ctrl.Options{
		Scheme:                  s,
		Metrics:                 c.metricsOptions(),
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          c.leaderElect,
		LeaderElectionID:        "bex-deployer.app.bex.co",
		LeaderElectionNamespace: c.namespace,
		// The cache drops each object's managedFields, which nothing here reads and
		// which are often the larger part of an object (issue 18, idle memory).
		Cache: cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
	}
	if c.namespace != "" {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{c.namespace: {}}
	} else if c.leaderElect {
		opts.LeaderElectionNamespace = "default"
	}
	if c.leaderElectNS != "" {
		opts.LeaderElectionNamespace = c.leaderElectNS
	}
	if c.inProcessAgain {
		skip := true
		opts.Controller.SkipNameValidation = &skip
	}
	mgr, err := ctrl.NewManager(restCfg, opts)
	if err != nil {
		return err
	}
	kind, ok := runtimeNamed(c.runtimeName)
	if !ok {
		return fmt.Errorf("runtime %q: choose local or kubernetes", c.runtimeName)
	}
	cfg := deployer.DefaultConfig()
	cfg.BaseDomain, cfg.HTTPSPort, cfg.KeepReleases, cfg.ImageRepo = c.baseDomain, c.httpsPort, c.keepReleases, c.imageRepo
	rt, err := kind.deployer(c, mgr, &cfg)
	if err != nil {
		return err
	}
	r := &deployer.AppReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runtime: rt, Config: cfg}
	// Events are written to events.k8s.io/v1, which bex up's API server does not
	// serve (its memory): there, a recorder would only log an error for every
	// event it could not post, at every deploy.
	if served, err := servesGroupVersion(restCfg, "events.k8s.io/v1"); err != nil || served {
		r.Events = mgr.GetEventRecorder("bex-deployer")
	} else {
		c.log.Info("the API server serves no events.k8s.io/v1: the deployer records no Events")
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if unixHealth {
		if err := mgr.Add(unixHealthServer(healthSocket)); err != nil {
			return err
		}
	}
	say(c.errOut, c.log, "bex deployer: reconciling Apps with the %s runtime", c.runtimeName)
	return mgr.Start(ctx)
}

// metricsOptions is the metrics server: plain HTTP on loopback for bex up, where
// the address is the protection; with --metrics-secure, HTTPS that asks the API
// server who the caller is (TokenReview) and whether it may GET /metrics
// (SubjectAccessReview), since on a cluster any tenant's pod reaches the
// deployer's pod IP and the metrics name every app.
func (c *deployerCmd) metricsOptions() metricsserver.Options {
	o := metricsserver.Options{BindAddress: c.metricsAddr}
	if !c.metricsSecure {
		return o
	}
	o.SecureServing = true
	o.FilterProvider = filters.WithAuthenticationAndAuthorization
	// No CertDir: controller-runtime makes a self-signed certificate in memory at
	// each start; it encrypts, and the bearer token is what authenticates. HTTP/1.1
	// only, as operators scaffolded by kubebuilder do: HTTP/2's stream resets and
	// floods (CVE-2023-44487, CVE-2023-39325) are reachable by any pod before the
	// token is checked.
	o.TLSOpts = []func(*tls.Config){func(t *tls.Config) { t.NextProtos = []string{"http/1.1"} }}
	return o
}

// unixHealthServer serves /healthz and /readyz on a unix socket (mode 0600), for
// bex up: a TCP port on loopback would answer every local process and every
// container on the host's network. It runs with the manager, as controller-runtime's
// own probe server does, leader or not.
func unixHealthServer(path string) manager.Runnable {
	return notElected(func(ctx context.Context) error {
		_ = os.Remove(path) // a socket left by a killed deployer
		l, err := net.Listen("unix", path)
		if err != nil {
			return fmt.Errorf("health socket: %w", err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			l.Close()
			return err
		}
		ping := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}
		mux := http.NewServeMux()
		mux.Handle("/healthz", http.StripPrefix("/healthz", ping))
		mux.Handle("/readyz", http.StripPrefix("/readyz", ping))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			<-ctx.Done()
			_ = srv.Close()
		}()
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// notElected is a runnable that runs on every replica, not only on the leader.
type notElected manager.RunnableFunc

func (f notElected) Start(ctx context.Context) error { return f(ctx) }
func (notElected) NeedLeaderElection() bool          { return false }

func (c *deployerCmd) close() error {
	if c.closeRuntime != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.closeRuntime() }()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return errors.New("the local runtime did not stop within 10s")
		}
	}
	return nil
}

// servesGroupVersion says whether the API server at cfg serves gv
// ("group/version"), by its discovery.
func servesGroupVersion(cfg *rest.Config, gv string) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	_, err = dc.ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}
