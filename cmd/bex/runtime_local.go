package main

import (
	"context"
	"errors"
	"github.com/distribution/reference"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/deployer"
	"bex.co/bex/deployer/databases"
	deployruntime "bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/storage"
	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/tenantnet"
)

// localRuntime is --runtime local: containerd on this machine, whose state dir
// (STATE_DIR/runtime) the deployer and the gitserver share.
type localRuntime struct{}

func (localRuntime) deployer(c *deployerCmd, mgr ctrl.Manager, _ *deployer.Config) (deployruntime.Runtime, error) {
	addr := c.containerdAddr
	if addr == "" {
		addr = filepath.Join(c.stateDir, "containerd", "containerd.sock")
	}
	cfg := local.DefaultConfig()
	cfg.Address, cfg.Namespace, cfg.StateDir = addr, c.containerdNS, filepath.Join(c.stateDir, "runtime")
	cfg.TenantNet.AllowEgress = c.allowEgress
	// The local runtime adopts what runs before the manager's cache starts, so it
	// reads through a direct client.
	direct, err := newDirectClient(mgr)
	if err != nil {
		return nil, err
	}
	rt, err := local.New(cfg, direct, c.log)
	if err != nil {
		return nil, err
	}
	// Cron jobs run as one-offs of the deployer's own (owner "deployer":
	// apart from the gitserver's run one-offs, so that neither removes the
	// other's at start); their history and the cron:run tokens acted on are
	// kept beside the runtime's state file.
	oo, err := local.NewOneOffs(cfg, direct, "deployer", c.log)
	if err != nil {
		_ = rt.Close()
		return nil, err
	}
	sched, err := local.NewScheduler(oo, filepath.Join(cfg.StateDir, "cron.json"), nil, c.log)
	if err != nil {
		_ = oo.Close()
		_ = rt.Close()
		return nil, err
	}
	rt.SetScheduler(sched)
	c.closeRuntime = func() error { return errors.Join(sched.Close(), oo.Close(), rt.Close()) }
	// Managed databases run on the same runtime, reached through the tenants'
	// network at the apps' gateway.
	dbCfg := databases.DefaultConfig()
	dbCfg.Postgres, dbCfg.Redis = imageVersion(c.postgresImage), imageVersion(c.redisImage)
	dbr := &databases.Reconciler{Client: mgr.GetClient(), Runtime: rt, Network: databaseNetwork{cfg.TenantNet}, Config: dbCfg,
		Usage: func(key types.NamespacedName, volume string) (int64, error) {
			used, _, err := cfg.VolumeUsage(key, volume)
			return used, err
		}}
	if err := dbr.SetupWithManager(mgr); err != nil {
		_ = c.closeRuntime()
		return nil, err
	}
	return rt, nil
}

// databaseNetwork gives the databases their address on the tenants' network.
type databaseNetwork struct{ cfg tenantnet.Config }

func (n databaseNetwork) Host() netip.Addr { return n.cfg.AppsGateway() }

func (n databaseNetwork) Expose(ctx context.Context, name string, port uint16, target netip.AddrPort) error {
	return n.cfg.Expose(ctx, name, port, target)
}

func (n databaseNetwork) Unexpose(ctx context.Context, name string) error {
	return n.cfg.Unexpose(ctx, name)
}

// imageVersion is a database image and the version its tag says: "postgres:15"
// offers 15; an image without a tag offers what it runs, unnamed.
func imageVersion(ref string) databases.Image {
	img := databases.Image{Ref: ref}
	if named, err := reference.ParseNormalizedNamed(ref); err == nil {
		if tagged, ok := named.(reference.Tagged); ok {
			img.Version = tagged.Tag()
		}
	}
	return img
}

func (localRuntime) gitserver(c *gitserverCmd, env gitserverEnv) (*gitserverRuntime, error) {
	cfg := gitserverLocalConfig(c.stateDir, c.containerdAddr, c.containerdNS)
	rt := &gitserverRuntime{logs: localLogs{stateDir: cfg.StateDir, namespace: c.namespace}, configSecrets: env.kc}
	addr := cfg.Address
	// One machine: the state dir, buildkitd and containerd are this
	// process's to measure. On a cluster the disks are the nodes' and the
	// registry's, and system:df says so.
	rt.storage = &storage.Machine{StateDir: c.stateDir, Repos: env.repos, Builds: env.builder,
		Runtime: local.Disk{StateDir: cfg.StateDir, Namespace: c.namespace},
		OpenImages: func() (storage.ImageStore, error) {
			imgs, err := local.OpenImages(addr, c.containerdNS, c.log)
			if err != nil {
				return nil, err // a nil store, not a nil *local.Images in one
			}
			return imgs, nil
		},
		ImagesAt: addr, ImageRepo: c.imageRepo}
	// containerd is up before the gitserver under bex up; a gitserver started
	// without it (a machine that only serves git) still serves pushes of apps
	// without a release command, and `run` says it cannot.
	oneOffs, err := newLocalOneOffs(cfg, c.allowEgress, env.kc, c.log)
	if err != nil {
		c.log.Warn("one-off commands are off (run, release commands, postdeploy scripts)", "err", err)
	} else {
		rt.closers = append(rt.closers, oneOffs)
		rt.oneOffs = oneOffs
		// Volumes' usage and backups need the same containerd (to pause the
		// app): with the one-offs or not at all.
		vols, closer, err := newLocalVolumes(cfg, c.namespace, c.log)
		if err != nil {
			c.log.Warn("volumes' backups and usage are off", "err", err)
		} else {
			rt.closers = append(rt.closers, closer)
			rt.volumes = vols
		}
	}
	if !c.push {
		// deploy:image's images go where a build's do, into containerd.
		if rt.images, err = daemons.ContainerdClient(addr, c.containerdNS); err != nil {
			c.log.Warn("deploy:image is off: containerd is not reachable", "err", err)
			rt.images = nil
		} else {
			rt.closers = append(rt.closers, rt.images)
		}
	}
	return rt, nil
}

// localLogs reads the local runtime's log files from the state directory the
// deployer shares with this process (`bex deployer --runtime local` on the same
// machine).
type localLogs struct {
	stateDir  string // the local runtime's, STATE_DIR/runtime
	namespace string
}

func (l localLogs) Logs(ctx context.Context, app string, o backend.LogOptions, w io.Writer) error {
	return local.ReadLogs(ctx, l.stateDir, types.NamespacedName{Namespace: l.namespace, Name: app},
		local.LogOptions{Follow: o.Follow, Lines: o.Lines, Process: o.Process}, w)
}

// gitserverLocalConfig is the local runtime as the deployer's runtime has it
// on this machine: the same state dir and containerd (the defaults of
// local.Config but these, as localRuntime.deployer sets them).
func gitserverLocalConfig(stateDir, containerdAddr, containerdNS string) local.Config {
	addr := containerdAddr
	if addr == "" {
		addr = filepath.Join(stateDir, "containerd", "containerd.sock")
	}
	cfg := local.DefaultConfig()
	cfg.Address, cfg.Namespace, cfg.StateDir = strings.TrimPrefix(addr, "unix://"), containerdNS, filepath.Join(stateDir, "runtime")
	return cfg
}

// newLocalOneOffs makes the gitserver's one-offs on the local runtime cfg,
// on the deployer's network.
func newLocalOneOffs(cfg local.Config, allowEgress []netip.Prefix, kc client.Client, log *slog.Logger) (*local.OneOffs, error) {
	// The one-offs' runtime installs the tenants' rules: with the deployer's ranges.
	cfg.TenantNet.AllowEgress = allowEgress
	return local.NewOneOffs(cfg, kc, "gitserver", log)
}

// localVolumes adapts the local runtime's Volumes to the backend's
// VolumeStore: app names in the gitserver's namespace, and an archive the
// runtime refuses as an Invalid error (the sender's to fix).
type localVolumes struct {
	v         *local.Volumes
	namespace string
}

var _ backend.VolumeStore = localVolumes{}

func (l localVolumes) key(app string) types.NamespacedName {
	return types.NamespacedName{Namespace: l.namespace, Name: app}
}

func (l localVolumes) Usage(_ context.Context, app, name string) (int64, int64, error) {
	return l.v.Usage(l.key(app), name)
}

func (l localVolumes) Backup(ctx context.Context, app, name string, w io.Writer) error {
	return l.v.Backup(ctx, l.key(app), name, w)
}

func (l localVolumes) Restore(ctx context.Context, app, name string, r io.Reader) error {
	return restoreError(l.v.Restore(ctx, l.key(app), name, r), app, name)
}

// Pauses: the app's containers that mount the volume are paused meanwhile.
func (localVolumes) Pauses() bool { return true }

// newLocalVolumes reaches the volumes of the local runtime cfg on this
// machine.
func newLocalVolumes(cfg local.Config, namespace string, log *slog.Logger) (backend.VolumeStore, io.Closer, error) {
	v, err := local.NewVolumes(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	return localVolumes{v: v, namespace: namespace}, v, nil
}
