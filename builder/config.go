package builder

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"bex.co/bex/builder/plan"
)

// Config is the builder's configuration; cmd/bex fills it, starting from
// DefaultConfig.
type Config struct {
	// StateDir is where the fields below that are left empty point: Address is
	// unix://StateDir/buildkitd/buildkitd.sock, WorkDir StateDir/builds and
	// LogDir StateDir/build-logs. It has no default.
	StateDir string
	// Address is buildkitd's address, e.g. unix:///var/lib/bex/buildkitd/buildkitd.sock.
	Address string
	// TLS is how a tcp:// Address is reached: buildkitd's TCP listener runs
	// builds as root on its node, so on a cluster it takes only clients with a
	// certificate of its CA (mutual TLS), which holds whatever the network lets
	// through. Zero: no TLS (a unix socket, or a buildkitd nobody else reaches).
	TLS TLSConfig
	// ImageRepo names the images: <ImageRepo>/<app>:<commit>. On one node the
	// images stay in containerd under that name; on a cluster it is a registry
	// repository the cluster can pull from.
	ImageRepo string
	// Push pushes the image to ImageRepo's registry (cluster mode).
	Push bool
	// RegistryConfig is a Docker-style config.json whose "auths" hold the
	// credentials for pushing and for pulling private base images; empty means
	// anonymous access.
	RegistryConfig string
	// ImageResolveMode is how base images are found: "default" (pull when missing),
	// "pull" (always) or "local" (only what the image store has; for machines
	// without a registry).
	ImageResolveMode string
	// Timeout ends a build that runs longer (Heroku's limit is 15 minutes).
	Timeout time.Duration
	// MaxConcurrent bounds builds running at once; others wait for a slot.
	MaxConcurrent int
	// MaxContextBytes bounds the files of one build's context.
	MaxContextBytes int64
	// MaxContextFiles bounds the files, directories and links of one build's
	// context, so that a tree of many tiny files cannot fill the work directory's
	// inodes or keep the export busy.
	MaxContextFiles int
	// StepMemory is the memory limit of build steps (buildkitd's cgroup parent, set
	// where buildkitd is started), for the message of a step it kills; 0 when
	// unknown.
	StepMemory int64
	// StepCgroup is the directory of that cgroup (e.g.
	// /sys/fs/cgroup/memory/bex-builds-…); its OOM counters tell a step killed by
	// the limit from one that failed. Empty: no such detection (a remote buildkitd).
	StepCgroup string
	// WorkDir holds the exported commits while they build.
	WorkDir string
	// LogDir keeps the last KeepLogs build logs of each app, each at most
	// MaxLogBytes.
	LogDir      string
	KeepLogs    int
	MaxLogBytes int64
	// Plan holds the base images of generated Dockerfiles.
	Plan plan.Config
	// PlanBasesReady, when set, is a file whose appearance says that Plan's base
	// images are ready (empty) or could not be made (the reason): a build with a
	// generated Dockerfile waits for it (bases.go). `bex up --local-bases` makes
	// the Debian stand-ins after it is up and writes it.
	PlanBasesReady string
	// MinFreeBytes and MinFreePercent are the free space a running build leaves
	// on the file system of StateDir (the smaller of the two; either 0 turns the
	// watch off): a build under it is stopped with ErrDiskFull. No default:
	// the margin has one owner, the gitserver's pipeline (--min-free-disk,
	// which refuses builds from the start), and cmd/bex gives it here.
	MinFreeBytes   int64
	MinFreePercent float64
}

// TLSConfig holds the files of mutual TLS with buildkitd, read at each
// connection (a build), so that a renewed certificate is picked up without a
// restart.
type TLSConfig struct {
	// CA is the CA certificate (PEM) buildkitd's server certificate must chain
	// to; only it is trusted, not the system's roots.
	CA string
	// Cert and Key are the client's certificate and key (PEM), presented to
	// buildkitd, whose --tlscacert must have issued them.
	Cert, Key string
	// ServerName is the name buildkitd's certificate must hold; empty: the host
	// of Address.
	ServerName string
}

// enabled reports whether any TLS setting is made.
func (t TLSConfig) enabled() bool {
	return t.CA != "" || t.Cert != "" || t.Key != "" || t.ServerName != ""
}

// DefaultConfig returns the defaults. It names no StateDir: cmd/bex sets it.
func DefaultConfig() Config {
	return Config{
		ImageRepo:        "bex.local",
		ImageResolveMode: "default",
		Timeout:          15 * time.Minute,
		MaxConcurrent:    2,
		MaxContextBytes:  1 << 30,
		MaxContextFiles:  100_000,
		KeepLogs:         20,
		MaxLogBytes:      1 << 20,
		Plan:             plan.DefaultConfig(),
	}
}

// withPaths returns c with Address, WorkDir and LogDir, where empty, derived from
// StateDir (see Config).
func (c Config) withPaths() Config {
	if c.StateDir == "" {
		return c
	}
	if c.Address == "" {
		c.Address = "unix://" + filepath.Join(c.StateDir, "buildkitd", "buildkitd.sock")
	}
	if c.WorkDir == "" {
		c.WorkDir = filepath.Join(c.StateDir, "builds")
	}
	if c.LogDir == "" {
		c.LogDir = filepath.Join(c.StateDir, "build-logs")
	}
	return c
}

// Validate reports every problem of c at once, each naming its field; Address,
// WorkDir and LogDir left empty are derived from StateDir first.
func (c Config) Validate() error {
	c = c.withPaths()
	var errs []error
	if c.Address == "" {
		errs = append(errs, errors.New("Config.Address: required, or Config.StateDir to derive it from"))
	} else if !strings.Contains(c.Address, "://") {
		errs = append(errs, fmt.Errorf("Config.Address %q: needs a scheme, e.g. unix:///run/buildkit/buildkitd.sock", c.Address))
	}
	if c.TLS.enabled() {
		if !strings.HasPrefix(c.Address, "tcp://") {
			errs = append(errs, fmt.Errorf("Config.TLS: buildkitd speaks TLS on a tcp:// address only, not %q", c.Address))
		}
		if c.TLS.CA == "" {
			errs = append(errs, errors.New("Config.TLS.CA: required with TLS, the CA buildkitd's certificate must chain to"))
		}
		if (c.TLS.Cert == "") != (c.TLS.Key == "") {
			errs = append(errs, errors.New("Config.TLS.Cert and Config.TLS.Key: both or neither"))
		}
	}
	if c.ImageRepo == "" || strings.ContainsAny(c.ImageRepo, " @:") && !strings.Contains(c.ImageRepo, "/") {
		errs = append(errs, fmt.Errorf("Config.ImageRepo %q: not a repository name like bex.local or registry.example:5000/apps", c.ImageRepo))
	}
	switch c.ImageResolveMode {
	case "default", "pull", "local":
	default:
		errs = append(errs, fmt.Errorf("Config.ImageResolveMode %q: not default, pull or local", c.ImageResolveMode))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("Config.Timeout %s: must be positive", c.Timeout))
	}
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"MaxConcurrent", int64(c.MaxConcurrent)}, {"MaxContextBytes", c.MaxContextBytes},
		{"MaxContextFiles", int64(c.MaxContextFiles)}, {"KeepLogs", int64(c.KeepLogs)}, {"MaxLogBytes", c.MaxLogBytes},
	} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("Config.%s %d: must be at least 1", n.name, n.v))
		}
	}
	for _, d := range []struct{ name, v string }{{"WorkDir", c.WorkDir}, {"LogDir", c.LogDir}} {
		if d.v == "" {
			errs = append(errs, fmt.Errorf("Config.%s: required, or Config.StateDir to derive it from", d.name))
		}
	}
	if c.MinFreeBytes < 0 {
		errs = append(errs, fmt.Errorf("Config.MinFreeBytes %d: must not be negative (0 turns the disk watch off)", c.MinFreeBytes))
	}
	if c.MinFreePercent < 0 || c.MinFreePercent > 100 {
		errs = append(errs, fmt.Errorf("Config.MinFreePercent %g: must be between 0 and 100", c.MinFreePercent))
	}
	if c.StepCgroup != "" && (c.StepMemory <= 0 || !filepath.IsAbs(c.StepCgroup)) {
		errs = append(errs, fmt.Errorf("Config.StepCgroup %q: needs an absolute path and Config.StepMemory, the memory limit it has", c.StepCgroup))
	}
	if err := c.Plan.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Config.Plan: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("builder: %w", err)
	}
	return nil
}
