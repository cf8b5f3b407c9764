package gitserver

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// Config is the gitserver's configuration. cmd/bex fills it from flags and BEX_*
// variables; DefaultConfig gives the defaults.
type Config struct {
	// Addr is the SSH listen address.
	Addr string
	// HostKeyPath is the ed25519 host key, generated on first start and kept.
	HostKeyPath string
	// ReposDir holds one bare repository per app, <app>.git.
	ReposDir string
	// Agent is the agent string sent to git ("bex/<version>").
	Agent string

	// MaxConcurrentBuilds bounds builds running at once, across apps.
	MaxConcurrentBuilds int
	// LockWait bounds how long a push waits for another push to the same app; after
	// it, the push is refused with a reason. Longer than BuildTimeout, so that a push
	// behind a build that runs to its limit still gets its turn.
	LockWait time.Duration
	// BuildTimeout ends a build that runs longer (Heroku's limit is 15 minutes).
	BuildTimeout time.Duration
	// RolloutTimeout bounds the wait for a release to serve.
	RolloutTimeout time.Duration
	// KeepAlive is how often a silent push sends a keep-alive packet, so proxies and
	// clients do not drop the connection during long steps.
	KeepAlive time.Duration
	// HandshakeTimeout is how long a connection may take to authenticate and open
	// its session.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection with no traffic at all for this long.
	IdleTimeout time.Duration
	// MaxPackBytes bounds one push's pack.
	MaxPackBytes int64
	// MaxObjectBytes bounds each object of a push or an upstream fetch (a file,
	// mostly), checked on the size the pack declares before anything is inflated.
	// It also bounds the gitserver's memory: no object larger is ever held.
	MaxObjectBytes int64
	// SessionRecheck is how often open sessions are looked up again by their key;
	// a session whose key was removed is closed at the next check.
	SessionRecheck time.Duration

	// FetchTimeout bounds the fetch of an app's upstream (Deploy).
	FetchTimeout time.Duration
	// AllowFileUpstreams lets Deploy fetch file:// upstreams. Off by default: such
	// a URL can name any repository on this machine, another app's included, and
	// whoever may edit an App could then read it.
	AllowFileUpstreams bool
	// UpstreamKnownHosts is the known_hosts file that ssh upstreams' host keys are
	// checked against.
	UpstreamKnownHosts string
}

// DefaultMaxObjectBytes is GitHub's limit on one file: 100 MiB.
const DefaultMaxObjectBytes = 100 << 20

// DefaultConfig returns the defaults, with state under stateDir.
func DefaultConfig(stateDir string) Config {
	return Config{
		Addr:                ":2222",
		HostKeyPath:         filepath.Join(stateDir, "ssh_host_ed25519_key"),
		ReposDir:            filepath.Join(stateDir, "repos"),
		Agent:               "bex/dev",
		MaxConcurrentBuilds: 4,
		LockWait:            20 * time.Minute,
		BuildTimeout:        15 * time.Minute,
		RolloutTimeout:      5 * time.Minute,
		KeepAlive:           15 * time.Second,
		HandshakeTimeout:    30 * time.Second,
		IdleTimeout:         10 * time.Minute,
		MaxPackBytes:        2 << 30,
		MaxObjectBytes:      DefaultMaxObjectBytes,
		SessionRecheck:      time.Second,
		FetchTimeout:        5 * time.Minute,
		UpstreamKnownHosts:  filepath.Join(stateDir, "upstream_known_hosts"),
	}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("gitserver: the SSH address is empty"))
	}
	if c.HostKeyPath == "" || c.ReposDir == "" {
		errs = append(errs, errors.New("gitserver: the host key path and the repositories directory must be set"))
	}
	if c.MaxConcurrentBuilds < 1 {
		errs = append(errs, fmt.Errorf("gitserver: max concurrent builds is %d; it must be at least 1", c.MaxConcurrentBuilds))
	}
	for name, d := range map[string]time.Duration{
		"lock wait": c.LockWait, "build timeout": c.BuildTimeout, "rollout timeout": c.RolloutTimeout,
		"keep-alive": c.KeepAlive, "handshake timeout": c.HandshakeTimeout, "idle timeout": c.IdleTimeout,
		"session recheck interval": c.SessionRecheck, "fetch timeout": c.FetchTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("gitserver: the %s must be positive, not %s", name, d))
		}
	}
	if c.MaxPackBytes <= 0 {
		errs = append(errs, errors.New("gitserver: the maximum pack size must be positive"))
	}
	if c.MaxObjectBytes <= 0 {
		errs = append(errs, errors.New("gitserver: the maximum object size must be positive"))
	}
	return errors.Join(errs...)
}
