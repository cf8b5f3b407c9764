package kube

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Defaults of Config.
const (
	// DefaultPort is where every process is told to listen (PORT), as on Heroku's
	// Cedar stack and in most buildpacks' examples.
	DefaultPort = 8080
	// DefaultMaxSurge is how many extra pods a rollout may start at once. With
	// maxUnavailable 0 this is what bounds the extra capacity a deploy needs.
	DefaultMaxSurge = 1
	// DefaultTerminationGracePeriodSeconds is the time between SIGTERM and SIGKILL,
	// Heroku's 30 seconds.
	DefaultTerminationGracePeriodSeconds = 30
	// DefaultDrainSeconds is how long a stopping web pod keeps running before it
	// gets SIGTERM (a preStop sleep), so that the edge has seen its endpoint go
	// before the app stops accepting connections.
	DefaultDrainSeconds = 5
	// DefaultFieldManager is the server-side apply field manager of every object
	// this package writes.
	DefaultFieldManager = "bex-deployer"
)

// Config configures the cluster runtime. DefaultConfig gives the defaults, and a
// zero field means its default: New and Validate fill them in.
type Config struct {
	// Port is the value of PORT given to every process, the web container's port,
	// the readiness probe's port and the Service's target port. Default 8080.
	Port int32
	// ProgressDeadlineSeconds is the boot timeout of apps whose health check does
	// not set bootTimeoutSeconds (or that have none): a Deployment that makes no
	// progress for that long fails the release. Default 60
	// (appv1.DefaultBootTimeoutSeconds).
	ProgressDeadlineSeconds int32
	// MaxSurge is how many pods above the desired count a rollout may run.
	// maxUnavailable is always 0: an old pod stops only when a new one is ready.
	// Default 1.
	MaxSurge int32
	// TerminationGracePeriodSeconds is how long a stopping pod has between SIGTERM
	// and SIGKILL, drain included. Default 30.
	TerminationGracePeriodSeconds int64
	// DrainSeconds is the preStop sleep of web pods: how long a stopping web pod
	// still serves while the edge drops its endpoint. Default 5; negative disables
	// it. It must be shorter than the grace period.
	DrainSeconds int64
	// ImagePullSecret, when set, is the name of a Secret in the app's namespace
	// that pods pull their image with (a private registry). Optional.
	ImagePullSecret string
	// FieldManager is the server-side apply field manager. Default "bex-deployer".
	FieldManager string
	// HostUsers runs app pods in the node's user namespace (hostUsers: true).
	// Default false: every pod gets a user namespace of its own (hostUsers:
	// false), so uid 0 in an app is an unprivileged uid on the node, as on the
	// local runtime. It needs nodes that support it (Kubernetes 1.33 or later,
	// containerd 2 or CRI-O 1.25 with idmapped mounts, Linux 6.3 or later); on a
	// cluster whose nodes do not, set it, or app pods fail to start.
	HostUsers bool
	// VolumeStorageClass is the StorageClass of the PersistentVolumeClaims of
	// apps' volumes (hcloud-volumes with Hetzner's CSI driver). Default empty:
	// the cluster's default class.
	VolumeStorageClass string
	// RegistryDelete deletes from the registry the manifests of pruned
	// releases and of deleted apps (runtime.Images), in the registry the
	// deployer's image repository names (its Config.ImageRepo, the builder's
	// push target). The registry must allow deletes (distribution:
	// storage.delete.enabled) and run its garbage collection to free the
	// blobs. Default false: nothing is deleted.
	RegistryDelete bool
	// RegistryInsecure speaks plain HTTP to the registry (bex's own, inside the
	// cluster). Loopback and private addresses are plain HTTP anyway.
	RegistryInsecure bool
	// RegistryConfig is a Docker-style config.json whose "auths" hold the
	// registry's credentials (the builder's own file). Default anonymous.
	RegistryConfig string
	// HelperImage is bex's own image, which the helper pods of volumes'
	// backups and restores run (VolumeData: `bex volume-archive`). Default
	// empty: VolumeData cannot be made (the gitserver's --volume-helper-image).
	HelperImage string
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.ProgressDeadlineSeconds == 0 {
		c.ProgressDeadlineSeconds = appv1.DefaultBootTimeoutSeconds
	}
	if c.MaxSurge == 0 {
		c.MaxSurge = DefaultMaxSurge
	}
	if c.TerminationGracePeriodSeconds == 0 {
		c.TerminationGracePeriodSeconds = DefaultTerminationGracePeriodSeconds
	}
	if c.DrainSeconds == 0 {
		c.DrainSeconds = DefaultDrainSeconds
	}
	if c.FieldManager == "" {
		c.FieldManager = DefaultFieldManager
	}
	return c
}

// Validate reports every invalid field of c, its zero fields taken as their
// defaults, each naming its field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("Config.Port, port %d: want 1 to 65535", c.Port))
	}
	if c.ProgressDeadlineSeconds < 1 {
		errs = append(errs, fmt.Errorf("Config.ProgressDeadlineSeconds, progress deadline %ds: want at least 1s", c.ProgressDeadlineSeconds))
	}
	if c.MaxSurge < 1 {
		// maxUnavailable is 0, and a Deployment with both 0 cannot roll at all.
		errs = append(errs, fmt.Errorf("Config.MaxSurge, max surge %d: want at least 1 (old pods stop only once new ones are ready)", c.MaxSurge))
	}
	if c.TerminationGracePeriodSeconds < 0 {
		errs = append(errs, fmt.Errorf("Config.TerminationGracePeriodSeconds, termination grace period %ds: want 0 or more", c.TerminationGracePeriodSeconds))
	}
	if c.DrainSeconds > 0 && c.DrainSeconds >= c.TerminationGracePeriodSeconds {
		errs = append(errs, fmt.Errorf("Config.DrainSeconds, drain %ds: want less than the termination grace period (%ds), or the app never gets SIGTERM before SIGKILL",
			c.DrainSeconds, c.TerminationGracePeriodSeconds))
	}
	if c.ImagePullSecret != "" {
		for _, msg := range validation.IsDNS1123Subdomain(c.ImagePullSecret) {
			errs = append(errs, fmt.Errorf("Config.ImagePullSecret, image pull secret %q: %s", c.ImagePullSecret, msg))
		}
	}
	if c.FieldManager == "" {
		errs = append(errs, errors.New("Config.FieldManager: empty"))
	}
	return errors.Join(errs...)
}
