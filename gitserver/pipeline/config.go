package pipeline

import (
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"bex.co/bex/gitserver/receive"
	"bex.co/bex/gitserver/upstream"
)

// Config is the pipeline's configuration. cmd/bex fills it from flags and BEX_*
// variables, starting from DefaultConfig; each setting has this one owner (the
// builder and the image importer are given the disk margin and the build's
// timeout from here).
type Config struct {
	// StateDir is where the paths below that are left empty go: ReposDir is
	// StateDir/repos and UpstreamKnownHosts StateDir/upstream_known_hosts. Its
	// file system is the one the disk margin is kept on. It has no default.
	StateDir string
	// ReposDir holds one bare repository per app, <app>.git.
	ReposDir string

	// MaxConcurrentBuilds bounds builds running at once, across apps: the one
	// bound on builds (cmd/bex gives the builder the same, so that its own
	// slots never make a build wait).
	MaxConcurrentBuilds int
	// LockWait bounds how long a push or deploy waits for another push or deploy
	// of the same app; after it, it is refused with a reason. Longer than
	// BuildTimeout, so that a push behind a build that runs to its limit still
	// gets its turn.
	LockWait time.Duration
	// RepackTimeout bounds one background `git gc --auto` of an app's repository
	// after a push (repack.go); a gc past it is killed (git leaves the repository
	// valid). 0: no repacks.
	RepackTimeout time.Duration
	// BuildTimeout ends a build that runs longer (Heroku's limit is 15 minutes):
	// the one build timeout (cmd/bex gives the builder the same, for its log).
	BuildTimeout time.Duration
	// RolloutTimeout bounds the wait for a release to serve.
	RolloutTimeout time.Duration
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

// DefaultBuildTimeout is Config.BuildTimeout's default, Heroku's limit.
const DefaultBuildTimeout = 15 * time.Minute

// DefaultConfig returns the defaults. It names no StateDir: cmd/bex sets it.
func DefaultConfig() Config {
	return Config{
		// Two builds at once: BuildKit's solves take the machine's CPU and
		// memory; more wait for a slot, saying so.
		MaxConcurrentBuilds: 2,
		LockWait:            20 * time.Minute,
		RepackTimeout:       10 * time.Minute,
		BuildTimeout:        DefaultBuildTimeout,
		RolloutTimeout:      5 * time.Minute,
		MaxPackBytes:        2 << 30,
		MaxObjectBytes:      DefaultMaxObjectBytes,
		MaxPushObjects:      DefaultMaxPushObjects,
		MinFreeBytes:        DefaultMinFreeBytes,
		MinFreePercent:      DefaultMinFreePercent,
		FetchTimeout:        5 * time.Minute,
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
	for _, p := range []struct{ name, v string }{
		{"ReposDir", c.ReposDir}, {"UpstreamKnownHosts", c.UpstreamKnownHosts},
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
		{"FetchTimeout", c.FetchTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("Config.%s %s: must be positive", d.name, d.v))
		}
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
		return fmt.Errorf("pipeline: %w", err)
	}
	return nil
}
