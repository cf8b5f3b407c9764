package tenantnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	gocni "github.com/containerd/go-cni"
	"golang.org/x/sys/unix"
)

// Network attaches namespaces to one of the tenants' CNI networks.
type Network struct {
	name string
	cni  gocni.CNI
}

// AppsNetwork returns the app instances' network. Its plugins are checked once
// here, so that a missing package is named at start rather than at the first
// instance.
func NewAppsNetwork(cfg Config) (*Network, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	if err := cfg.CheckPlugins(); err != nil {
		return nil, err
	}
	c, err := gocni.New(gocni.WithMinNetworkCount(2), gocni.WithPluginDir([]string{cfg.PluginDir}), gocni.WithInterfacePrefix("eth"))
	if err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	if err := c.Load(gocni.WithConfListBytes(cfg.AppsConfList()), gocni.WithLoNetwork); err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	return &Network{name: AppsNetwork, cni: c}, nil
}

// Attach runs CNI ADD for the namespace at nsPath on behalf of id (a container id)
// and returns the namespace's address on eth0.
func (n *Network) Attach(ctx context.Context, id, nsPath string) (netip.Addr, error) {
	res, err := n.cni.Setup(ctx, id, nsPath)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("attach %s to %s: %w", id, n.name, err)
	}
	for name, iface := range res.Interfaces {
		if name == "lo" {
			continue
		}
		for _, ipc := range iface.IPConfigs {
			if a, ok := netip.AddrFromSlice(ipc.IP); ok && a.Unmap().Is4() {
				return a.Unmap(), nil
			}
		}
	}
	_ = n.cni.Remove(context.WithoutCancel(ctx), id, nsPath)
	return netip.Addr{}, fmt.Errorf("attach %s to %s: CNI returned no IPv4 address", id, n.name)
}

// Detach runs CNI DEL for id: the veth pair goes, the address returns to the
// pool. It is idempotent, as CNI DEL is, and works on a namespace that is gone
// (host-local releases by container id).
func (n *Network) Detach(ctx context.Context, id, nsPath string) error {
	if err := n.cni.Remove(ctx, id, nsPath); err != nil {
		return fmt.Errorf("detach %s from %s: %w", id, n.name, err)
	}
	return nil
}

// DetachAll detaches and removes every namespace kept under dir as
// <dir>/<id>/netns (the local runtime's layout), with its directory. For a
// platform that stops with its tenants: nothing of their network outlives it.
func (n *Network) DetachAll(ctx context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name(), "netns")
		// The local runtime's sysfs of the namespace (its instance's /sys) goes
		// first: RemoveAll must not walk into it.
		if err := unix.Unmount(filepath.Join(dir, e.Name(), "sys"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
			continue
		}
		err := errors.Join(n.Detach(ctx, e.Name(), path), RemoveNetNS(path))
		if err == nil {
			err = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// newBuildsNetwork is the builds' network as buildkitd's CNI provider loads it
// (loopback first, so that the interface is eth1), for releasing what a
// buildkitd left.
func newBuildsNetwork(cfg Config) (*Network, error) {
	c, err := gocni.New(gocni.WithMinNetworkCount(2), gocni.WithPluginDir([]string{cfg.PluginDir}), gocni.WithInterfacePrefix("eth"))
	if err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	if err := c.Load(gocni.WithLoNetwork, gocni.WithConfListBytes(cfg.BuildsConfList())); err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	return &Network{name: BuildsNetwork, cni: c}, nil
}

// cniResults is libcni's cache of ADD results (go-cni has no option for another).
var cniResults = "/var/lib/cni/results"

// cachedResult is what ReleaseStale and Attached read of a cached ADD result.
type cachedResult struct {
	ContainerID string `json:"containerId"`
	NetworkName string `json:"networkName"`
	Netns       string `json:"netns"`
}

// Attached reports whether id has a live attachment to the apps' network on
// this machine: libcni's cached ADD result for it names a namespace that is
// still mounted. It is the machine's truth, not one process's: every bex on
// the machine attaches to the one network (its addresses are allocated in one
// store), so whether a namespace of id is live cannot be told from the
// directories of one of them. SweepLinks asks it.
func Attached(id string) bool {
	// libcni names the file <network>-<container id>-<interface>.
	m, _ := filepath.Glob(filepath.Join(cniResults, AppsNetwork+"-"+id+"-*"))
	for _, f := range m {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var cached cachedResult
		if json.Unmarshal(data, &cached) == nil && cached.ContainerID == id && cached.NetworkName == AppsNetwork && IsNetNS(cached.Netns) {
			return true
		}
	}
	return false
}

// ReleaseStale runs CNI DEL for every attachment to the tenants' networks whose
// namespace is gone: a buildkitd or a local runtime killed before it released
// its namespaces leaves host-local's address allocations, which outlive any
// directory of theirs. The namespace path is in libcni's cached result; a path
// that is not a mounted namespace any more cannot come back, so its attachment
// is released.
func ReleaseStale(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	entries, err := os.ReadDir(cniResults)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	nets := map[string]*Network{}
	var errs []error
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(cniResults, e.Name()))
		if err != nil {
			continue // released meanwhile
		}
		var cached cachedResult
		if json.Unmarshal(data, &cached) != nil || cached.ContainerID == "" || IsNetNS(cached.Netns) {
			continue
		}
		n := nets[cached.NetworkName]
		if n == nil {
			switch cached.NetworkName {
			case AppsNetwork:
				n, err = NewAppsNetwork(cfg)
			case BuildsNetwork:
				n, err = newBuildsNetwork(cfg)
			default:
				continue // not bex's
			}
			if err != nil {
				return err
			}
			nets[cached.NetworkName] = n
		}
		if err := n.Detach(ctx, cached.ContainerID, cached.Netns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
