package local

import (
	"errors"
	"fmt"
	"time"

	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/tenantnet"
)

// Config configures a Runtime. DefaultConfig gives the defaults, and a zero field
// means its default: New and Validate fill them in. StateDir has none.
type Config struct {
	// Address is containerd's gRPC socket. Default /run/containerd/containerd.sock.
	Address string
	// Namespace is the containerd namespace the instances live in. Default "bex".
	Namespace string
	// Snapshotter unpacks images and holds the instances' root filesystems.
	// Default "overlayfs".
	Snapshotter string
	// StateDir holds the state file (port allocations, what serves) and the
	// instances' logs. Required: it must survive a restart of bex, or running
	// containers could not be adopted with their ports.
	StateDir string

	// Network is where instances run: NetworkTenant (default), a network
	// namespace of its own per instance, or NetworkHost, the host's.
	Network string
	// TenantNet is the tenants' network (subnets, CNI plugins, filter chains, the
	// non-public ranges opened to tenants: AllowEgress, the deployer's
	// --allow-tenant-egress) of NetworkTenant, whose rules the runtime installs
	// when it starts. Its defaults are tenantnet's (its zero fields mean them).
	TenantNet tenantnet.Config
	// NetworkPool is how many attached namespaces NetworkTenant keeps ready, so
	// that starting an instance does not wait for CNI. Default 2; negative: none.
	NetworkPool int

	// PortMin and PortMax bound the ports given to instances as PORT (inclusive).
	// Default 20000-29999.
	PortMin, PortMax int

	// IDBase is the first host uid (and gid) given to apps' user namespaces;
	// IDRanges is how many ranges of IDRangeSize ids follow it, one per app. uid 0
	// in an instance is IDBase + n*65536 on the host, an id no host user has.
	// Defaults 1<<30 (above the subordinate ids useradd hands out from 100000) and
	// 4096 ranges.
	IDBase   uint32
	IDRanges int

	// Drain is how long the instances of a release keep running after the
	// endpoints moved away from them, for requests already routed to them.
	// Default 5s.
	Drain time.Duration
	// StopTimeout is how long a stopped instance gets between SIGTERM and SIGKILL.
	// Default 10s.
	StopTimeout time.Duration
	// BootTimeout is how long a new web instance may take to become ready when the
	// App's healthCheck does not say. Default 60s (appv1.DefaultBootTimeoutSeconds).
	BootTimeout time.Duration

	// LogMaxBytes is the size at which an instance's log is rotated; one previous
	// file is kept, so an instance uses at most twice this. Default 10 MiB.
	LogMaxBytes int64
	// LogKeepStopped is how many log files of instances that are gone are kept per
	// app, for `logs` after a failed release. Default 10.
	LogKeepStopped int

	// RestartBackoff is the wait before the first restart of an exited instance;
	// it doubles up to RestartBackoffMax. Defaults 1s and 30s.
	RestartBackoff, RestartBackoffMax time.Duration
	// CrashLoopRestarts exits within CrashLoopWindow make an instance crash-looping.
	// Defaults 3 and 1 minute.
	CrashLoopRestarts int
	CrashLoopWindow   time.Duration

	// LivenessInterval is how often a ready web instance is checked again (its
	// health check path, or a connection to PORT); LivenessFailures checks failed
	// in a row take it out of the endpoints and restart it, as a hung process
	// would otherwise keep its share of the requests. Defaults 10s and 3.
	LivenessInterval time.Duration
	LivenessFailures int

	// VolumeTransferTimeout bounds a volume's backup or restore (Volumes), and
	// so how long the app's containers that mount it stay paused: one that takes
	// longer is cancelled, its containers resumed (a restore leaves the volume as
	// it was). A start of an instance or one-off that mounts the volume waits for
	// a backup or restore at most this and a minute, then fails (an instance's
	// supervisor tries again). Default 1h.
	VolumeTransferTimeout time.Duration

	// CgroupParent is the tenants' parent cgroup, under which every container
	// of the runtime (instances, one-offs, cron runs) gets its own, as
	// /<CgroupParent>/<container id> in each hierarchy. Default Namespace, the
	// path containerd gives a container of that namespace.
	CgroupParent string
	// TenantsPidsMax is pids.max of CgroupParent: the tasks of all the tenants
	// together, each instance having its own 4096 below it. Default half of the
	// host's pid_max (/proc/sys/kernel/pid_max), so that instances forking
	// together leave the platform the other half.
	TenantsPidsMax int64
}

// DefaultNamespace is the containerd namespace the runtime's containers are in,
// and (bex up) the one buildkitd builds into.
const DefaultNamespace = "bex"

// DefaultConfig returns the defaults; StateDir, which has none, is empty.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns cfg with every unset field set to its default.
func (cfg Config) withDefaults() Config {
	if cfg.Address == "" {
		cfg.Address = "/run/containerd/containerd.sock"
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = "overlayfs"
	}
	if cfg.Network == "" {
		cfg.Network = NetworkTenant
	}
	cfg.TenantNet = cfg.TenantNet.WithDefaults()
	if cfg.NetworkPool == 0 {
		cfg.NetworkPool = 2
	}
	if cfg.PortMin == 0 && cfg.PortMax == 0 {
		cfg.PortMin, cfg.PortMax = 20000, 29999
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = 1 << 30
	}
	if cfg.IDRanges == 0 {
		cfg.IDRanges = 4096
	}
	if cfg.Drain == 0 {
		cfg.Drain = 5 * time.Second
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
	}
	if cfg.LogMaxBytes == 0 {
		cfg.LogMaxBytes = 10 << 20
	}
	if cfg.LogKeepStopped == 0 {
		cfg.LogKeepStopped = 10
	}
	if cfg.RestartBackoff == 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.RestartBackoffMax == 0 {
		cfg.RestartBackoffMax = 30 * time.Second
	}
	if cfg.CrashLoopRestarts == 0 {
		cfg.CrashLoopRestarts = 3
	}
	if cfg.CrashLoopWindow == 0 {
		cfg.CrashLoopWindow = time.Minute
	}
	if cfg.LivenessInterval == 0 {
		cfg.LivenessInterval = 10 * time.Second
	}
	if cfg.LivenessFailures == 0 {
		cfg.LivenessFailures = 3
	}
	if cfg.VolumeTransferTimeout == 0 {
		cfg.VolumeTransferTimeout = time.Hour
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = cfg.Namespace
	}
	if cfg.TenantsPidsMax == 0 {
		cfg.TenantsPidsMax = daemons.TenantsPidsMax()
	}
	return cfg
}

// Validate reports every field that is out of range, its zero fields taken as
// their defaults, each naming its field.
func (cfg Config) Validate() error {
	cfg = cfg.withDefaults()
	var errs []error
	if cfg.StateDir == "" {
		errs = append(errs, errors.New("Config.StateDir: required (port allocations and logs live there)"))
	}
	switch cfg.Network {
	case NetworkTenant:
		if err := cfg.TenantNet.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("Config.TenantNet: %w", err))
		}
	case NetworkHost:
	default:
		errs = append(errs, fmt.Errorf("Config.Network %q: want %q or %q", cfg.Network, NetworkTenant, NetworkHost))
	}
	if cfg.PortMin < 1024 || cfg.PortMax > 65535 || cfg.PortMin > cfg.PortMax {
		errs = append(errs, fmt.Errorf("Config.PortMin-PortMax, port range %d-%d: want 1024 <= min <= max <= 65535", cfg.PortMin, cfg.PortMax))
	}
	if cfg.IDBase < IDRangeSize {
		errs = append(errs, fmt.Errorf("Config.IDBase, uid base %d: want at least %d, above the host's own users", cfg.IDBase, IDRangeSize))
	}
	if cfg.IDRanges < 1 || uint64(cfg.IDBase)+uint64(cfg.IDRanges)*IDRangeSize > 1<<32-1 {
		errs = append(errs, fmt.Errorf("Config.IDRanges, uid ranges %d from %d: want at least one, ending below 2^32-1", cfg.IDRanges, cfg.IDBase))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Drain", cfg.Drain}, {"StopTimeout", cfg.StopTimeout}, {"BootTimeout", cfg.BootTimeout},
		{"RestartBackoff", cfg.RestartBackoff}, {"RestartBackoffMax", cfg.RestartBackoffMax},
		{"CrashLoopWindow", cfg.CrashLoopWindow}, {"LivenessInterval", cfg.LivenessInterval},
		{"VolumeTransferTimeout", cfg.VolumeTransferTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("Config.%s %v: negative", d.name, d.v))
		}
	}
	if cfg.RestartBackoffMax < cfg.RestartBackoff {
		errs = append(errs, fmt.Errorf("Config.RestartBackoffMax %v: less than Config.RestartBackoff %v", cfg.RestartBackoffMax, cfg.RestartBackoff))
	}
	if cfg.LogMaxBytes < 4096 {
		errs = append(errs, fmt.Errorf("Config.LogMaxBytes, log size limit %d: want at least 4096 bytes", cfg.LogMaxBytes))
	}
	if cfg.LogKeepStopped < 0 {
		errs = append(errs, fmt.Errorf("Config.LogKeepStopped %d: negative", cfg.LogKeepStopped))
	}
	if cfg.LivenessFailures < 1 {
		errs = append(errs, fmt.Errorf("Config.LivenessFailures %d: want at least 1", cfg.LivenessFailures))
	}
	if !cgroupNameRE.MatchString(cfg.CgroupParent) {
		errs = append(errs, fmt.Errorf("Config.CgroupParent %q: want letters, digits, '.', '_' and '-', one path segment", cfg.CgroupParent))
	}
	if cfg.TenantsPidsMax < 64 {
		errs = append(errs, fmt.Errorf("Config.TenantsPidsMax %d: want at least 64", cfg.TenantsPidsMax))
	}
	if cfg.CrashLoopRestarts < 1 {
		errs = append(errs, fmt.Errorf("Config.CrashLoopRestarts %d: want at least 1", cfg.CrashLoopRestarts))
	}
	return errors.Join(errs...)
}
