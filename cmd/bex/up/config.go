package up

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/edge"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/clientaddr"
	"bex.co/bex/internal/machine/daemons"
)

// Config is what `bex up`'s flags say; DefaultConfig gives the flags' defaults.
// The zero values of optional fields mean the components' defaults.
type Config struct {
	// StateDir holds everything.
	StateDir string
	// SSHAddr, HTTPAddr and HTTPSAddr are the public listen addresses.
	SSHAddr, HTTPAddr, HTTPSAddr string
	// HooksAddr is the HTTP address of the webhooks (/hooks/<app>) and the agents'
	// MCP endpoint (/mcp), served by the gitserver; empty: off.
	HooksAddr string
	// BaseDomain: apps answer at <app>.<BaseDomain>.
	BaseDomain string
	// AdminKeys are authorized_keys lines made keys of the admin user on start.
	AdminKeys []byte
	// ACMEEmail and ACMECA choose ACME certificates; without both, or with the base
	// domain localhost, the local CA issues them.
	ACMEEmail, ACMECA string
	// TrustedProxies is passed to the edge (--trusted-proxies): CIDR,... of load
	// balancers in front of this machine, whose PROXY headers and X-Forwarded-For
	// name the client. Empty: none.
	TrustedProxies string
	// ContainerdAddr is an existing containerd's socket; empty starts one.
	ContainerdAddr string
	// Runc is the runc the containerd bex up starts runs every container with
	// (--runc); empty: runc next to the bex binary (bin/, where `make tools`
	// builds it), else in PATH. One without daemons.RuncFixes is refused.
	Runc string
	// ImageResolveMode is how builds find base images: default, pull or local.
	ImageResolveMode string
	// BusyboxBase puts Debian's busybox-static into containerd as
	// docker.io/library/busybox:latest when no image of that name is there, so
	// that `FROM busybox` builds on a machine that cannot pull (with
	// ImageResolveMode local).
	BusyboxBase bool
	// LocalBases builds (or finds in LocalBasesCache) Debian stand-ins for the
	// official images the plans build on (internal/machine/baseimage), imports them and
	// the busybox base into containerd, and points the zero-config builds at them
	// (the gitserver's --plan-image-* flags): builds without a Dockerfile on a
	// machine that cannot pull (with ImageResolveMode local).
	LocalBases bool
	// LocalBasesCache is where the stand-ins are kept between runs; empty is
	// baseimage.DefaultCacheDir, outside any state dir and clone.
	LocalBasesCache string
	// AllowPrivateUpstreams is passed to the gitserver
	// (--allow-private-upstreams): apps may fetch upstreams on loopback, private
	// and link-local addresses (a git host on the LAN). Off by default.
	AllowPrivateUpstreams bool
	// AllowPrivateRegistries is passed to the gitserver
	// (--allow-private-registries): deploy:image may pull from registries on
	// loopback, private and link-local addresses.
	AllowPrivateRegistries bool
	// AllowTenantEgress are the ranges tenants may reach although they are not
	// the Internet (--allow-tenant-egress, tenantnet.Config.AllowEgress): the
	// rules installed before buildkitd starts hold them, and the deployer and the
	// gitserver, which install the same rules for instances and one-offs, are
	// given them. Empty: none, the LAN is closed to tenants.
	AllowTenantEgress []netip.Prefix
	// MaxObjectBytes is passed to the gitserver (--max-object-size); 0 keeps its
	// default.
	MaxObjectBytes int64
	// MaxPushObjects is passed to the gitserver (--max-push-objects); 0 keeps its
	// default.
	MaxPushObjects int64
	// MinFreeDiskBytes is passed to the gitserver (--min-free-disk); 0 keeps its
	// default.
	MinFreeDiskBytes int64
	// BuildMemory is the memory limit shared by the build steps running at once, in
	// bytes; 0 is the default, the smaller of 4 GiB and half the machine's memory.
	BuildMemory int64
	// BuildCacheBytes bounds BuildKit's build cache, in bytes (its GC policy); 0 is
	// the default, the smaller of 10 GiB and a tenth of the state dir's file system,
	// measured at start.
	BuildCacheBytes int64
	// BuildCacheKeep is how long build cache nobody used is kept whatever its size;
	// 0 keeps it while the cache is under BuildCacheBytes.
	BuildCacheKeep time.Duration
	// GoMemoryDefaults leaves every process at the Go runtime's memory defaults
	// (no soft limit, GOGC 100) instead of memory.go's settings, and bex up keeps
	// what its start allocated: the baseline BenchmarkIdleMemory compares with.
	GoMemoryDefaults bool
	// LogFormat is the children's --log-format, text or json: bex up's own. Empty
	// passes none (their default, text).
	LogFormat string
	// Bex is the path of the bex binary that runs the components.
	Bex string
	// Out receives the progress lines and the final instructions.
	Out io.Writer
	// Log receives the supervisor's events (restarts).
	Log *slog.Logger
}

// Namespace is where Apps live on one machine.
const Namespace = edge.DefaultNamespace

// ContainerdNamespace is the containerd namespace builds go to and apps run in.
const ContainerdNamespace = local.DefaultNamespace

// AdminUser is the user the admin keys are given to.
const AdminUser = "admin"

// DefaultConfig returns the defaults of bex up's flags. Bex and Out, which have
// none, are left for the caller.
func DefaultConfig() Config {
	return Config{
		StateDir:         "/var/lib/bex",
		SSHAddr:          gitserver.DefaultConfig().Addr,
		HTTPAddr:         edge.DefaultHTTPAddr,
		HTTPSAddr:        edge.DefaultHTTPSAddr,
		HooksAddr:        "127.0.0.1:8090",
		BaseDomain:       edge.DefaultBaseDomain,
		ImageResolveMode: builder.DefaultConfig().ImageResolveMode,
		MaxObjectBytes:   pipeline.DefaultMaxObjectBytes,
		MinFreeDiskBytes: pipeline.DefaultMinFreeBytes,
		LogFormat:        "text",
		BuildCacheKeep:   daemons.DefaultBuildCacheKeep,
	}
}

// Validate reports every problem of c at once, each naming its flag (or, for
// what no flag sets, its field).
func (c Config) Validate() error {
	var errs []error
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir: required"))
	}
	for _, a := range []struct{ flag, addr string }{
		{"--ssh-addr", c.SSHAddr}, {"--http-addr", c.HTTPAddr}, {"--https-addr", c.HTTPSAddr}, {"--hooks-addr", c.HooksAddr},
	} {
		if a.flag == "--hooks-addr" && a.addr == "" {
			continue // off
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want HOST:PORT or :PORT (%v)", a.flag, a.addr, err))
		}
	}
	if c.BaseDomain == "" || strings.ContainsAny(c.BaseDomain, "/: ") {
		errs = append(errs, fmt.Errorf("--base-domain %q: want a domain such as localhost or apps.example.com", c.BaseDomain))
	}
	if _, err := clientaddr.Parse(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("--trusted-proxies: %w", err))
	}
	switch c.ImageResolveMode {
	case "", "default", "pull", "local":
	default:
		errs = append(errs, fmt.Errorf("--image-resolve-mode %q: want default, pull or local", c.ImageResolveMode))
	}
	if c.MaxObjectBytes < 0 {
		errs = append(errs, fmt.Errorf("--max-object-size %d: must not be negative", c.MaxObjectBytes))
	}
	if c.MinFreeDiskBytes < 0 {
		errs = append(errs, fmt.Errorf("--min-free-disk %d: must not be negative", c.MinFreeDiskBytes))
	}
	if c.MaxPushObjects < 0 {
		errs = append(errs, fmt.Errorf("--max-push-objects %d: must not be negative", c.MaxPushObjects))
	}
	if c.BuildMemory < 0 || c.BuildMemory > 0 && c.BuildMemory < 16<<20 {
		errs = append(errs, fmt.Errorf("--build-memory %d: give at least 16Mi, or nothing for the default", c.BuildMemory))
	}
	if c.BuildCacheBytes < 0 || c.BuildCacheBytes > 0 && c.BuildCacheBytes < 64<<20 {
		errs = append(errs, fmt.Errorf("--build-cache-size %d: give at least 64Mi, or nothing for the default", c.BuildCacheBytes))
	}
	if c.BuildCacheKeep < 0 {
		errs = append(errs, fmt.Errorf("--build-cache-keep %s: must not be negative (0: no age limit)", c.BuildCacheKeep))
	}
	if c.LocalBasesCache != "" && !filepath.IsAbs(c.LocalBasesCache) {
		errs = append(errs, fmt.Errorf("--local-bases-cache %q: want an absolute path", c.LocalBasesCache))
	}
	switch c.LogFormat {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", c.LogFormat))
	}
	if c.Bex == "" {
		errs = append(errs, errors.New("Config.Bex: required"))
	}
	if c.Out == nil {
		errs = append(errs, errors.New("Config.Out: required"))
	}
	return errors.Join(errs...)
}

// port returns the port of addr.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// dialable turns a listen address into one to dial: ":2222" → "127.0.0.1:2222".
func dialable(addr string) string {
	host, p, _ := net.SplitHostPort(addr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, p)
}
