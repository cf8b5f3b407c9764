package builder

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"bex.co/bex/builder/plan"
)

// Config is the builder's configuration; cmd/bex fills it, DefaultConfig gives the
// defaults.
type Config struct {
	// Address is buildkitd's address, e.g. unix:///var/lib/bex/buildkitd/buildkitd.sock.
	Address string
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
}

// DefaultConfig returns the defaults, with state under stateDir.
func DefaultConfig(stateDir string) Config {
	return Config{
		Address:          "unix://" + filepath.Join(stateDir, "buildkitd", "buildkitd.sock"),
		ImageRepo:        "bex.local",
		ImageResolveMode: "default",
		Timeout:          15 * time.Minute,
		MaxConcurrent:    2,
		MaxContextBytes:  1 << 30,
		MaxContextFiles:  100_000,
		WorkDir:          filepath.Join(stateDir, "builds"),
		LogDir:           filepath.Join(stateDir, "build-logs"),
		KeepLogs:         20,
		MaxLogBytes:      1 << 20,
		Plan:             plan.DefaultConfig(),
	}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if !strings.Contains(c.Address, "://") {
		errs = append(errs, fmt.Errorf("builder: buildkitd address %q needs a scheme, e.g. unix:///run/buildkit/buildkitd.sock", c.Address))
	}
	if c.ImageRepo == "" || strings.ContainsAny(c.ImageRepo, " @:") && !strings.Contains(c.ImageRepo, "/") {
		errs = append(errs, fmt.Errorf("builder: image repository %q is not a repository name like bex.local or registry.example:5000/apps", c.ImageRepo))
	}
	switch c.ImageResolveMode {
	case "default", "pull", "local":
	default:
		errs = append(errs, fmt.Errorf("builder: image resolve mode %q is not default, pull or local", c.ImageResolveMode))
	}
	if c.Timeout <= 0 || c.MaxConcurrent < 1 || c.MaxContextBytes <= 0 || c.MaxContextFiles <= 0 {
		errs = append(errs, errors.New("builder: the timeout, the concurrency and the context limits (bytes and files) must be positive"))
	}
	if c.WorkDir == "" || c.LogDir == "" || c.KeepLogs < 1 || c.MaxLogBytes <= 0 {
		errs = append(errs, errors.New("builder: the work and log directories must be set, and at least one log of positive size kept"))
	}
	if c.StepCgroup != "" && (c.StepMemory <= 0 || !filepath.IsAbs(c.StepCgroup)) {
		errs = append(errs, fmt.Errorf("builder: the build steps' cgroup %q needs an absolute path and the memory limit it has", c.StepCgroup))
	}
	if err := c.Plan.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
