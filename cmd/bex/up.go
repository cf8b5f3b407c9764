package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"bex.co/bex/cmd/bex/up"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/machine/baseimage"
)

// upCmd runs the whole platform on this machine.
type upCmd struct {
	out, errOut io.Writer
	log         *slog.Logger
	// logFormat is the root's --log-format (or BEX_LOG_FORMAT), resolved before run.
	logFormat *string

	cfg           up.Config
	adminKeyFile  string
	maxObjectSize byteSize
	minFreeDisk   byteSize
	buildMemory   byteSize
	buildCache    byteSize
	allowEgress   egressFlag

	// started, when set, receives the platform once it is up (tests).
	started chan<- *up.Platform
}

func (c *upCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run bex on this machine: containerd, buildkitd, the API, the deployer, the edge and git push over SSH",
		Long: "up starts and supervises everything bex needs on one machine, with all its data in\n" +
			"--state-dir, and prints how to push. Ctrl-C (or SIGTERM) stops everything; starting\n" +
			"again on the same state dir brings every app back without a rebuild. It runs as root.\n" +
			"Every flag can also be set as BEX_<FLAG>, e.g. BEX_BASE_DOMAIN; BEX_ADMIN_KEYS=a.pub,b.pub\n" +
			"names more public key files to make admin.",
		Args:    cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) },
	}
	c.cfg = up.DefaultConfig()
	d := c.cfg
	f := cmd.Flags()
	f.StringVar(&c.cfg.StateDir, "state-dir", d.StateDir, "directory for everything bex keeps")
	f.StringVar(&c.cfg.SSHAddr, "ssh-addr", d.SSHAddr, "SSH address for git push and commands")
	f.StringVar(&c.cfg.HTTPAddr, "http-addr", d.HTTPAddr, "HTTP address (ACME challenges, redirects to HTTPS)")
	f.StringVar(&c.cfg.HTTPSAddr, "https-addr", d.HTTPSAddr, "HTTPS address of the apps")
	f.StringVar(&c.cfg.HooksAddr, "hooks-addr", d.HooksAddr, "where the gitserver serves the webhooks (/hooks/<app>) and the agents' MCP endpoint (/mcp) on plain HTTP; the edge serves them to the world at https://BASE-DOMAIN/hooks/ and /mcp; empty: off")
	f.StringVar(&c.cfg.BaseDomain, "base-domain", d.BaseDomain, "apps answer at https://<app>.<base-domain>")
	f.StringVar(&c.adminKeyFile, "admin-key", "", "OpenSSH public key file made admin on start (e.g. ~/.ssh/id_ed25519.pub)")
	f.StringVar(&c.cfg.ACMEEmail, "acme-email", "", "ACME account email (certificates from Let's Encrypt, or --acme-ca)")
	f.StringVar(&c.cfg.ACMECA, "acme-ca", "", "ACME directory URL; without it and --acme-email, or for the base domain localhost, a local CA issues certificates (STATE_DIR/ca.pem)")
	f.StringVar(&c.cfg.TrustedProxies, "trusted-proxies", "", "CIDR,... of load balancers in front of this machine, passed to the edge: their PROXY protocol headers and X-Forwarded-For name the client")
	f.StringVar(&c.cfg.ContainerdAddr, "containerd-addr", "", "an existing containerd's socket (default: start one in STATE_DIR/containerd)")
	f.StringVar(&c.cfg.Runc, "runc", "", "the runc the containerd bex up starts runs every container with; it must have the November 2025 fixes (1.2.8, 1.3.3, 1.4.0 or later) (default: runc next to the bex binary, where `make tools` builds it, else in PATH)")
	f.StringVar(&c.cfg.ImageResolveMode, "image-resolve-mode", d.ImageResolveMode, "how builds find base images: default, pull, or local (images already in containerd; no registry)")
	c.maxObjectSize = byteSize(d.MaxObjectBytes)
	f.Var(&c.maxObjectSize, "max-object-size", "largest object (a file, mostly) that a push may hold, passed to the gitserver (GitHub's limit is 100MiB)")
	f.Int64Var(&c.cfg.MaxPushObjects, "max-push-objects", 0, fmt.Sprintf("most objects a push may hold, passed to the gitserver, which refuses a larger one from its pack's header before reading any object (0: the gitserver's default, %d)", pipeline.DefaultConfig().MaxPushObjects))
	c.minFreeDisk = byteSize(d.MinFreeDiskBytes)
	f.Var(&c.minFreeDisk, "min-free-disk", fmt.Sprintf("free space kept on the file system of --state-dir, passed to the gitserver: with less free (this or %d%% of the file system, whichever is smaller) pushes and deploys are refused at once", pipeline.DefaultMinFreePercent))
	f.BoolVar(&c.cfg.AllowPrivateRegistries, "allow-private-registries", false, "let deploy:image pull from registries on loopback, private (RFC 1918, CGNAT, ULA) and link-local addresses, passed to the gitserver (a registry on the LAN); off: a member could reach this machine's and the LAN's services")
	f.BoolVar(&c.cfg.AllowPrivateUpstreams, "allow-private-upstreams", false, "let apps fetch upstreams on loopback, private (RFC 1918, CGNAT, ULA) and link-local addresses, passed to the gitserver (a git host on the LAN); off: a member could reach this machine's and the LAN's services")
	f.Var(&c.allowEgress, "allow-tenant-egress", egressUsage+"; passed to the deployer and the gitserver")
	f.BoolVar(&c.cfg.BusyboxBase, "busybox-base", false, "put Debian's busybox-static into containerd as docker.io/library/busybox:latest if no such image is there, so FROM busybox builds without a registry (with --image-resolve-mode local)")
	f.BoolVar(&c.cfg.LocalBases, "local-bases", false, "build (once per machine, with mmdebstrap from Debian's mirror) or reuse Debian stand-ins for the official node, golang, python, ruby, php and distroless images and Heroku's stack, import them (in the background once bex is up: builds without a Dockerfile wait for them) and the busybox base into containerd, and build apps without a Dockerfile on them, so they build without a registry (with --image-resolve-mode local); implies --busybox-base")
	f.StringVar(&c.cfg.LocalBasesCache, "local-bases-cache", baseimage.DefaultCacheDir, "where --local-bases keeps the stand-ins between runs, shared by every state dir and clone on this machine")
	f.Var(&c.buildMemory, "build-memory", "memory limit shared by the build steps running at once, e.g. 4Gi or 512Mi; a step past it fails the build (default: the smaller of 4Gi and half the machine's memory)")
	f.Var(&c.buildCache, "build-cache-size", "most bytes BuildKit's build cache keeps; past it the least recently used goes after a build, e.g. 20GiB (default: the smaller of 10GiB and 10% of the state dir's file system)")
	f.DurationVar(&c.cfg.BuildCacheKeep, "build-cache-keep", d.BuildCacheKeep, "build cache unused this long is removed whatever the size, e.g. 72h; 0: no age limit")
	f.BoolVar(&c.cfg.GoMemoryDefaults, "go-memory-defaults", false, "run every process with the Go runtime's memory defaults (no soft limit, GOGC 100) instead of bex's idle-memory settings: more memory, for comparison")
	return cmd
}

func (c *upCmd) run(ctx context.Context) error {
	c.cfg.BuildMemory = int64(c.buildMemory)
	c.cfg.BuildCacheBytes = int64(c.buildCache)
	c.cfg.AllowTenantEgress = c.allowEgress
	if c.adminKeyFile != "" {
		key, err := os.ReadFile(c.adminKeyFile)
		if err != nil {
			return fmt.Errorf("--admin-key: %w", err)
		}
		c.cfg.AdminKeys = append(c.cfg.AdminKeys, key...)
	}
	// BEX_ADMIN_KEYS=a.pub,b.pub, as for bex gitserver --admin-keys.
	for _, file := range strings.Split(os.Getenv("BEX_ADMIN_KEYS"), ",") {
		if file = strings.TrimSpace(file); file == "" {
			continue
		}
		key, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("BEX_ADMIN_KEYS: %w", err)
		}
		c.cfg.AdminKeys = append(append(c.cfg.AdminKeys, '\n'), key...)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	c.cfg.Bex, c.cfg.Out, c.cfg.Log = exe, c.out, c.log
	if c.logFormat != nil {
		c.cfg.LogFormat = *c.logFormat
	}
	c.cfg.MaxObjectBytes = int64(c.maxObjectSize)
	c.cfg.MinFreeDiskBytes = int64(c.minFreeDisk)
	p, err := up.Start(ctx, c.cfg)
	if err != nil {
		return err
	}
	if c.started != nil {
		c.started <- p
	}
	<-ctx.Done()
	return p.Stop()
}

func (c *upCmd) close() error { return nil }
