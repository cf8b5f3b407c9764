package gitserver

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// Config is the gitserver's configuration. cmd/bex fills it from flags and BEX_*
// variables, starting from DefaultConfig.
type Config struct {
	// Addr is the SSH listen address.
	Addr string
	// StateDir is where HostKeyPath goes when it is left empty:
	// StateDir/ssh_host_ed25519_key. It has no default.
	StateDir string
	// HostKeyPath is the ed25519 host key, generated on first start and kept.
	HostKeyPath string
	// Agent is the agent string sent to git ("bex/<version>").
	Agent string

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
	// SessionRecheck is how often open sessions are checked again: a session whose
	// key was removed is closed at the next check, and one whose user (as read
	// again) may no longer use an app it works on is ended, saying why. At most
	// 1 s keeps the promise that withdrawn access ends a session within 2 s.
	SessionRecheck time.Duration
}

// DefaultConfig returns the defaults. It names no StateDir: cmd/bex sets it.
func DefaultConfig() Config {
	return Config{
		Addr:               ":2222",
		Agent:              "bex/dev",
		KeepAlive:          15 * time.Second,
		HandshakeTimeout:   10 * time.Second,
		MaxUnauthPerSource: 10,
		MaxUnauthConns:     100,
		// A burst of 40 from one address is served; a flood from one holds at
		// most 10+30 sockets and goroutines, and from all 100+200.
		MaxUnauthQueuedPerSource: 30,
		MaxUnauthQueued:          200,
		UnauthQueueWait:          20 * time.Second,
		MaxSessionsPerConn:       10,
		MaxEnvRequests:           16,
		MaxEnvBytes:              1024,
		IdleTimeout:              10 * time.Minute,
		SessionRecheck:           time.Second,
	}
}

// withPaths returns c with its empty paths derived from StateDir (see Config).
func (c Config) withPaths() Config {
	if c.StateDir == "" {
		return c
	}
	for _, p := range []struct {
		field *string
		name  string
	}{
		{&c.HostKeyPath, "ssh_host_ed25519_key"},
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
		{"HostKeyPath", c.HostKeyPath},
	} {
		if p.v == "" {
			errs = append(errs, fmt.Errorf("Config.%s: required, or Config.StateDir to derive it from", p.name))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"KeepAlive", c.KeepAlive}, {"HandshakeTimeout", c.HandshakeTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"SessionRecheck", c.SessionRecheck},
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
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gitserver: %w", err)
	}
	return nil
}
