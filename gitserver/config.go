package gitserver

import (
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"bex.co/bex/gitserver/receive"
	"bex.co/bex/gitserver/upstream"
)

// Config is the gitserver's configuration. cmd/bex fills it from flags and BEX_*
// variables, starting from DefaultConfig.
type Config struct {
	// Addr is the SSH listen address.
	Addr string
	// StateDir is where the paths below that are left empty go: HostKeyPath is
	// StateDir/ssh_host_ed25519_key, ReposDir StateDir/repos and
	// UpstreamKnownHosts StateDir/upstream_known_hosts. It has no default.
	StateDir string
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
	// RepackTimeout bounds one background `git gc --auto` of an app's repository
	// after a push (repack.go); a gc past it is killed (git leaves the repository
	// valid). 0: no repacks.
	RepackTimeout time.Duration
	// BuildTimeout ends a build that runs longer (Heroku's limit is 15 minutes).
	BuildTimeout time.Duration
	// RolloutTimeout bounds the wait for a release to serve.
	RolloutTimeout time.Duration
	// KeepAlive is how often a silent push sends a keep-alive packet, so proxies and
	// clients do not drop the connection during long steps.
	KeepAlive time.Duration
	// HandshakeTimeout is how long a connection may take from accept to
	// authenticated; past it the connection is closed.
	HandshakeTimeout time.Duration
	// MaxUnauthPerSource and MaxUnauthConns cap the connections not yet
	// authenticated (counted from accept until a key's signature verifies) from one
	// source address and in total. A connection past either cap waits, without
	// being read, for a slot (up to UnauthQueueWait, then it is closed), so that
	// a burst from one address (a CI job, a team behind one NAT) is served in
	// turn; the waiting are bounded too, by MaxUnauthQueuedPerSource from one
	// source and MaxUnauthQueued in total, and a connection past those is closed
	// at once. 0 queued: none wait.
	MaxUnauthPerSource       int
	MaxUnauthConns           int
	MaxUnauthQueuedPerSource int
	MaxUnauthQueued          int
	UnauthQueueWait          time.Duration
	// MaxSessionsPerConn bounds the sessions open at once on one connection
	// (OpenSSH's MaxSessions is 10); one more is refused.
	MaxSessionsPerConn int
	// MaxEnvRequests bounds the env requests of a session and MaxEnvBytes the size
	// of each (name and value); the others are answered no and forgotten. git sends
	// one, GIT_PROTOCOL.
	MaxEnvRequests int
	MaxEnvBytes    int
	// IdleTimeout closes a connection with no traffic at all for this long.
	IdleTimeout time.Duration
	// MaxPackBytes bounds one push's pack.
	MaxPackBytes int64
	// MaxObjectBytes bounds each object of a push or an upstream fetch (a file,
	// mostly), checked on the size the pack declares before anything is inflated.
	// It also bounds the gitserver's memory: no object larger is ever held.
	MaxObjectBytes int64
	// MaxPushObjects bounds the objects of a push or an upstream fetch, checked
	// on the count its pack's header announces, before any object is read: the
	// index of a pack costs memory per object (about 90 bytes).
	MaxPushObjects int64
	// MinFreeBytes and MinFreePercent are the free space kept on the file system
	// of StateDir: the smaller of MinFreeBytes and MinFreePercent of its size.
	// With less free, a push is refused before its pack is read and a Deploy
	// before it fetches or builds, saying how much is free. Either one 0 turns the
	// check off. The smaller, so that 5% of a large disk does not ask for tens of
	// GiB, nor 1 GiB most of a small one.
	MinFreeBytes   int64
	MinFreePercent float64
	// FreeSpace reads the free space; nil: Statfs.
	FreeSpace FreeSpace
	// SessionRecheck is how often open sessions are checked again: a session whose
	// key was removed is closed at the next check, and one whose user (as read
	// again) may no longer use an app it works on is ended, saying why. At most
	// 1 s keeps the promise that withdrawn access ends a session within 2 s.
	SessionRecheck time.Duration

	// FetchTimeout bounds the fetch of an app's upstream (Deploy).
	FetchTimeout time.Duration
	// AllowFileUpstreams lets Deploy fetch file:// upstreams. Off by default: such
	// a URL can name any repository on this machine, another app's included, and
	// whoever may edit an App could then read it.
	AllowFileUpstreams bool
	// AllowPrivateUpstreams lets Deploy fetch from loopback, private, link-local
	// and metadata addresses (see package upstream). Off by default: a member
	// could otherwise reach the API server, the LAN or the cloud's metadata
	// service from this server. On for a git host on the LAN.
	AllowPrivateUpstreams bool
	// UpstreamResolver looks up upstream names when a URL is checked before a
	// fetch; nil: the system's. (The dial checks the address it connects to
	// whatever this says.)
	UpstreamResolver upstream.Resolver
	// UpstreamRootCAs are the CAs https upstreams' certificates are checked
	// against; nil: the system's.
	UpstreamRootCAs *x509.CertPool
	// UpstreamKnownHosts is the known_hosts file that ssh upstreams' host keys are
	// checked against.
	UpstreamKnownHosts string
}

// DefaultMaxObjectBytes is GitHub's limit on one file: 100 MiB.
const DefaultMaxObjectBytes = 100 << 20

// DefaultMaxPushObjects is 2,000,000 objects (receive.DefaultMaxObjects says why).
const DefaultMaxPushObjects = receive.DefaultMaxObjects

// DefaultConfig returns the defaults. It names no StateDir: cmd/bex sets it.
func DefaultConfig() Config {
	return Config{
		Addr:                ":2222",
		Agent:               "bex/dev",
		MaxConcurrentBuilds: 4,
		LockWait:            20 * time.Minute,
		RepackTimeout:       10 * time.Minute,
		BuildTimeout:        15 * time.Minute,
		RolloutTimeout:      5 * time.Minute,
		KeepAlive:           15 * time.Second,
		HandshakeTimeout:    10 * time.Second,
		MaxUnauthPerSource:  10,
		MaxUnauthConns:      100,
		// A burst of 40 from one address is served; a flood from one holds at
		// most 10+30 sockets and goroutines, and from all 100+200.
		MaxUnauthQueuedPerSource: 30,
		MaxUnauthQueued:          200,
		UnauthQueueWait:          20 * time.Second,
		MaxSessionsPerConn:       10,
		MaxEnvRequests:           16,
		MaxEnvBytes:              1024,
		IdleTimeout:              10 * time.Minute,
		MaxPackBytes:             2 << 30,
		MaxObjectBytes:           DefaultMaxObjectBytes,
		MaxPushObjects:           DefaultMaxPushObjects,
		SessionRecheck:           time.Second,
		MinFreeBytes:             DefaultMinFreeBytes,
		MinFreePercent:           DefaultMinFreePercent,
		FetchTimeout:             5 * time.Minute,
	}
}

// withPaths returns c with its empty paths derived from StateDir (see Config).
func (c Config) withPaths() Config {
	if c.FreeSpace == nil {
		c.FreeSpace = Statfs
	}
	if c.StateDir == "" {
		return c
	}
	for _, p := range []struct {
		field *string
		name  string
	}{
		{&c.HostKeyPath, "ssh_host_ed25519_key"},
		{&c.ReposDir, "repos"},
		{&c.UpstreamKnownHosts, "upstream_known_hosts"},
	} {
		if *p.field == "" {
			*p.field = filepath.Join(c.StateDir, p.name)
		}
	}
	return c
}

// Validate reports every problem of c at once, each naming its field; the paths
// left empty are derived from StateDir first.
func (c Config) Validate() error {
	c = c.withPaths()
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("Config.Addr: required (the SSH listen address)"))
	}
	for _, p := range []struct{ name, v string }{
		{"HostKeyPath", c.HostKeyPath}, {"ReposDir", c.ReposDir}, {"UpstreamKnownHosts", c.UpstreamKnownHosts},
	} {
		if p.v == "" {
			errs = append(errs, fmt.Errorf("Config.%s: required, or Config.StateDir to derive it from", p.name))
		}
	}
	if c.RepackTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.RepackTimeout %s: must not be negative (0: no repacks)", c.RepackTimeout))
	}
	if c.MaxConcurrentBuilds < 1 {
		errs = append(errs, fmt.Errorf("Config.MaxConcurrentBuilds %d: must be at least 1", c.MaxConcurrentBuilds))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"LockWait", c.LockWait}, {"BuildTimeout", c.BuildTimeout}, {"RolloutTimeout", c.RolloutTimeout},
		{"KeepAlive", c.KeepAlive}, {"HandshakeTimeout", c.HandshakeTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"SessionRecheck", c.SessionRecheck}, {"FetchTimeout", c.FetchTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("Config.%s %s: must be positive", d.name, d.v))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"MaxUnauthPerSource", c.MaxUnauthPerSource}, {"MaxUnauthConns", c.MaxUnauthConns},
		{"MaxSessionsPerConn", c.MaxSessionsPerConn}, {"MaxEnvRequests", c.MaxEnvRequests}, {"MaxEnvBytes", c.MaxEnvBytes},
	} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("Config.%s %d: must be at least 1", n.name, n.v))
		}
	}
	if c.MaxUnauthPerSource > c.MaxUnauthConns {
		errs = append(errs, fmt.Errorf("Config.MaxUnauthPerSource %d: must not exceed Config.MaxUnauthConns %d", c.MaxUnauthPerSource, c.MaxUnauthConns))
	}
	if c.MaxUnauthQueuedPerSource < 0 || c.MaxUnauthQueued < 0 {
		errs = append(errs, fmt.Errorf("Config.MaxUnauthQueuedPerSource %d, Config.MaxUnauthQueued %d: must not be negative", c.MaxUnauthQueuedPerSource, c.MaxUnauthQueued))
	}
	if c.MaxUnauthQueuedPerSource > c.MaxUnauthQueued {
		errs = append(errs, fmt.Errorf("Config.MaxUnauthQueuedPerSource %d: must not exceed Config.MaxUnauthQueued %d", c.MaxUnauthQueuedPerSource, c.MaxUnauthQueued))
	}
	if c.MaxUnauthQueued > 0 && c.UnauthQueueWait <= 0 {
		errs = append(errs, fmt.Errorf("Config.UnauthQueueWait %s: must be positive when connections may wait (Config.MaxUnauthQueued %d)", c.UnauthQueueWait, c.MaxUnauthQueued))
	}
	if c.MaxPackBytes <= 0 {
		errs = append(errs, fmt.Errorf("Config.MaxPackBytes %d: must be positive", c.MaxPackBytes))
	}
	if c.MaxObjectBytes <= 0 {
		errs = append(errs, fmt.Errorf("Config.MaxObjectBytes %d: must be positive", c.MaxObjectBytes))
	}
	if c.MaxPushObjects <= 0 || c.MaxPushObjects > receive.MaxObjectsLimit {
		errs = append(errs, fmt.Errorf("Config.MaxPushObjects %d: must be between 1 and %d", c.MaxPushObjects, receive.MaxObjectsLimit))
	}
	if c.MinFreeBytes < 0 {
		errs = append(errs, fmt.Errorf("Config.MinFreeBytes %d: must not be negative (0 turns the free-space check off)", c.MinFreeBytes))
	}
	if c.MinFreePercent < 0 || c.MinFreePercent > 100 {
		errs = append(errs, fmt.Errorf("Config.MinFreePercent %g: must be between 0 and 100", c.MinFreePercent))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gitserver: %w", err)
	}
	return nil
}
