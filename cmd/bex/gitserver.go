package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/builder"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/sshcmd"
)

// gitserverCmd runs the SSH git endpoint against an existing Kubernetes API and
// buildkitd: pushes build, record a release and wait for the deployer to roll it out.
type gitserverCmd struct {
	errOut io.Writer
	log    *slog.Logger

	apiFlags
	sshAddr          string
	namespace        string
	buildkitAddr     string
	imageRepo        string
	push             bool
	registryConfig   string
	imageResolveMode string
	runtime          string
	sshURL           string
	adminKeys        []string

	// ready, when set, receives the listen address once the server accepts.
	ready    chan<- string
	listener net.Listener
	cancel   context.CancelFunc
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
	f.StringVar(&c.sshAddr, "ssh-addr", ":2222", "SSH listen address")
	f.StringVar(&c.namespace, "namespace", "default", "namespace of the Apps")
	f.StringVar(&c.buildkitAddr, "buildkit-addr", "", "buildkitd address (default: unix://STATE_DIR/buildkitd/buildkitd.sock)")
	f.StringVar(&c.imageRepo, "image-repo", "bex.local", "repository that names the built images")
	f.BoolVar(&c.push, "push", false, "push the built images to --image-repo's registry (a cluster, where nodes pull them) instead of keeping them in buildkitd's containerd")
	f.StringVar(&c.registryConfig, "registry-config", "", "Docker-style config.json with the credentials for pushing and for private base images (default: anonymous)")
	f.StringVar(&c.imageResolveMode, "image-resolve-mode", "default", "how base images are found: default, pull, or local (no registry)")
	f.StringVar(&c.runtime, "runtime", "local", "the deployer's runtime, for the logs command: local (read from STATE_DIR/runtime) or kubernetes")
	f.StringSliceVar(&c.adminKeys, "admin-keys", nil, "OpenSSH public key files whose keys the user admin holds, made sure of at every start (BEX_ADMIN_KEYS=a.pub,b.pub)")
	f.StringVar(&c.sshURL, "ssh-url", "", "how users reach this server, for the hints commands print (default ssh://git@HOST:PORT)")
	return cmd
}

func (c *gitserverCmd) run(ctx context.Context) error {
	ctx, c.cancel = context.WithCancel(ctx)
	restCfg, s, err := c.connect()
	if err != nil {
		return err
	}
	kc, err := client.New(restCfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	dir, informers, err := access.Start(ctx, access.Config{Namespace: c.namespace}, restCfg, s, kc)
	if err != nil {
		return err
	}

	if err := ensureAdminKeys(ctx, kc, c.adminKeys); err != nil {
		return err
	}
	if ok, err := hasAdmin(ctx, kc); err == nil && !ok {
		fmt.Fprintf(c.errOut, "bex gitserver: no admin yet: run `bex users add NAME --admin --key ~/.ssh/id_ed25519.pub` on this machine, or start with --admin-keys FILE\n")
	}

	bcfg := builder.DefaultConfig(c.stateDir)
	if c.buildkitAddr != "" {
		bcfg.Address = c.buildkitAddr
	}
	bcfg.ImageRepo = c.imageRepo
	bcfg.Push, bcfg.RegistryConfig = c.push, c.registryConfig
	bcfg.ImageResolveMode = c.imageResolveMode
	b, err := builder.New(bcfg, c.log)
	if err != nil {
		return err
	}
	if err := b.Preflight(ctx); err != nil {
		return err
	}

	if c.runtime != "local" && c.runtime != "kubernetes" {
		return fmt.Errorf("--runtime %q: use local or kubernetes", c.runtime)
	}
	recorder := &releases.Recorder{Client: kc, Namespace: c.namespace, PollInterval: 50 * time.Millisecond}
	gcfg := gitserver.DefaultConfig(c.stateDir)
	gcfg.Addr = c.sshAddr
	// The commands need the server (to remove a repository under its push lock) and
	// the server takes the commands: the closure reads srv once it is set.
	var srv *gitserver.Server
	cmds, err := sshcmd.New(sshcmd.Config{
		Client: kc, Reader: informers, Namespace: c.namespace, Releases: recorder,
		Logs:   runtimeLogs{runtime: c.runtime, stateDir: filepath.Join(c.stateDir, "runtime"), namespace: c.namespace},
		Builds: buildLogs{b}, Host: c.sshURL, Log: c.log, RolloutTimeout: gcfg.RolloutTimeout,
		RemoveRepository: func(ctx context.Context, app string) error { return srv.RemoveRepository(ctx, app, 10*time.Second) },
	})
	if err != nil {
		return err
	}
	srv, err = gitserver.New(gcfg, dir, pushBuilder{b: b, apps: kc, namespace: c.namespace}, pushDeployer{recorder}, c.log, prometheus.DefaultRegisterer,
		gitserver.WithCommands(cmds))
	if err != nil {
		return err
	}
	c.listener, err = net.Listen("tcp", c.sshAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.errOut, "bex gitserver: listening on %s (host key %s)\n", c.listener.Addr(), gossh.FingerprintSHA256(srv.HostKey()))
	if c.ready != nil {
		c.ready <- c.listener.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(c.listener) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (c *gitserverCmd) close() error {
	if c.cancel != nil {
		c.cancel()
	}
	return nil
}
