package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/internal/tenantnet"
)

// Network modes of the runtime (Config.Network).
const (
	// NetworkTenant puts every instance in a network namespace of its own on the
	// tenants' CNI network (internal/tenantnet): it reaches neither the host's
	// listeners nor another instance; the edge dials its address.
	NetworkTenant = "tenant"
	// NetworkHost shares the host's network namespace: every instance reaches
	// every listener on the host. Only for measuring the cost of NetworkTenant and
	// for hosts without CNI plugins.
	NetworkHost = "host"
)

// network attaches instances to their network. In host mode every method is a
// no-op and an instance's address is 127.0.0.1.
type network struct {
	mode string
	dir  string // <state dir>/net: one directory per instance
	cni  *tenantnet.Network
	log  *slog.Logger
}

// attachment is an instance's place on the network.
type attachment struct {
	addr netip.Addr
	dir  string // "" on the host network
}

func (a attachment) netns() string      { return filepath.Join(a.dir, "netns") }
func (a attachment) resolvConf() string { return filepath.Join(a.dir, "resolv.conf") }
func (a attachment) hosts() string      { return filepath.Join(a.dir, "hosts") }

var loopback = netip.MustParseAddr("127.0.0.1")

func newNetwork(cfg Config, log *slog.Logger) (*network, error) {
	n := &network{mode: cfg.Network, dir: filepath.Join(cfg.StateDir, "net"), log: log}
	if n.mode == NetworkHost {
		return n, nil
	}
	// The rules are installed by bex up too; installing them here as well means no
	// instance ever runs in a namespace without them.
	if err := tenantnet.Install(context.Background(), cfg.TenantNet); err != nil {
		return nil, err
	}
	c, err := tenantnet.NewAppsNetwork(cfg.TenantNet)
	if err != nil {
		return nil, err
	}
	n.cni = c
	return n, nil
}

// setup creates the network namespace of container id, attaches it (CNI ADD) and
// writes its resolv.conf and hosts. On error nothing is left.
func (n *network) setup(ctx context.Context, id string) (attachment, error) {
	if n.mode == NetworkHost {
		return attachment{addr: loopback}, nil
	}
	att := attachment{dir: filepath.Join(n.dir, id)}
	if err := os.MkdirAll(att.dir, 0o700); err != nil {
		return attachment{}, err
	}
	if err := tenantnet.NewNetNS(att.netns()); err != nil {
		_ = os.RemoveAll(att.dir)
		return attachment{}, err
	}
	addr, err := n.cni.Attach(ctx, id, att.netns())
	if err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), id)
		return attachment{}, err
	}
	att.addr = addr
	host, err := os.ReadFile("/etc/resolv.conf")
	if err == nil {
		err = os.WriteFile(att.resolvConf(), tenantnet.ResolvConf(host), 0o644)
	}
	if err == nil {
		err = os.WriteFile(att.hosts(), tenantnet.Hosts(id, addr), 0o644)
	}
	if err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), id)
		return attachment{}, fmt.Errorf("network files of %s: %w", id, err)
	}
	return att, nil
}

// specOpts are the container spec options of the network: the namespace joined by
// path and its own resolv.conf and hosts, or the host's.
func (n *network) specOpts(att attachment) []oci.SpecOpts {
	if att.dir == "" {
		return []oci.SpecOpts{oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf, oci.WithHostHostsFile}
	}
	return []oci.SpecOpts{
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: att.netns()}),
		oci.WithMounts([]specs.Mount{
			{Destination: "/etc/resolv.conf", Type: "bind", Source: att.resolvConf(), Options: []string{"rbind", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: att.hosts(), Options: []string{"rbind", "ro"}},
		}),
	}
}

// teardown detaches container id (CNI DEL), unmounts its namespace and removes its
// directory. Idempotent: an instance never attached, or already torn down, is
// fine.
func (n *network) teardown(ctx context.Context, id string) error {
	if n.mode == NetworkHost {
		return nil
	}
	dir := filepath.Join(n.dir, id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	att := attachment{dir: dir}
	var errs []error
	if err := n.cni.Detach(ctx, id, att.netns()); err != nil {
		errs = append(errs, err)
	}
	if err := tenantnet.RemoveNetNS(att.netns()); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanup tears down the network of every instance directory whose container is
// not in live: left by a crash between setup and the container's creation, or by
// a container deleted while bex was down.
func (n *network) cleanup(ctx context.Context, live map[string]bool) {
	if n.mode == NetworkHost {
		return
	}
	entries, err := os.ReadDir(n.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || live[e.Name()] {
			continue
		}
		if err := n.teardown(ctx, e.Name()); err != nil {
			n.log.Warn("clean the network of a container that is gone", "container", e.Name(), "err", err)
		} else {
			n.log.Info("cleaned the network of a container that is gone", "container", e.Name())
		}
	}
}
