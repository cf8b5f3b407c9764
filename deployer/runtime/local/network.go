package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/internal/machine/tenantnet"
)

// Network modes of the runtime (Config.Network).
const (
	// NetworkTenant puts every instance in a network namespace of its own on the
	// tenants' CNI network (internal/machine/tenantnet): it reaches neither the host's
	// listeners nor another instance; the edge dials its address.
	NetworkTenant = "tenant"
	// NetworkHost shares the host's network namespace: every instance reaches
	// every listener on the host. Only for measuring the cost of NetworkTenant and
	// for hosts without CNI plugins.
	NetworkHost = "host"
)

// network attaches instances to their network. In host mode every method is a
// no-op and an instance's address is 127.0.0.1.
//
// Namespaces are attached ahead of need: a pool of poolSize attached namespaces
// is kept filled in the background, so that a rollout does not wait for CNI ADD
// (four plugin executions, about 100 ms here) on its way to a ready instance.
// A namespace's id (its directory under <state dir>/net and its CNI container
// id) is therefore its own, recorded on the container as a label.
type network struct {
	mode     string
	dir      string // <state dir>/net: one directory per namespace
	cni      *tenantnet.Network
	tn       tenantnet.Config // the rules' chains, for the links of databases
	log      *slog.Logger
	poolSize int

	ctx    context.Context // ends at close
	cancel context.CancelFunc
	pool   chan attachment
	refill chan struct{}
	done   chan struct{}
}

// attachment is an instance's place on the network.
type attachment struct {
	id   string // the namespace's id: CNI's container id, the name of dir
	addr netip.Addr
	dir  string // "" on the host network
}

func (a attachment) netns() string      { return filepath.Join(a.dir, "netns") }
func (a attachment) resolvConf() string { return filepath.Join(a.dir, "resolv.conf") }
func (a attachment) hosts() string      { return filepath.Join(a.dir, "hosts") }

// sysfs is what the instance's /sys is a bind of: a sysfs of its own network
// namespace (sysfs.go), or the host's /sys on the host network.
func (a attachment) sysfs() string {
	if a.dir == "" {
		return "/sys"
	}
	return filepath.Join(a.dir, "sys")
}

var loopback = netip.MustParseAddr("127.0.0.1")

func newNetwork(cfg Config, log *slog.Logger) (*network, error) {
	n := &network{mode: cfg.Network, dir: filepath.Join(cfg.StateDir, "net"), log: log, poolSize: cfg.NetworkPool, tn: cfg.TenantNet}
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

// start starts filling the pool; call it after cleanup, so that the pool of a
// previous run is gone first.
func (n *network) start() {
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.done = make(chan struct{})
	if n.mode == NetworkHost || n.poolSize <= 0 {
		close(n.done)
		return
	}
	n.pool = make(chan attachment, n.poolSize)
	n.refill = make(chan struct{}, 1)
	go n.fill()
}

// fill keeps the pool full until close, then empties it.
func (n *network) fill() {
	defer close(n.done)
	defer func() {
		for {
			select {
			case att := <-n.pool:
				if err := n.teardown(context.Background(), att.id); err != nil {
					n.log.Warn("tear down a pooled network namespace", "netns", att.id, "err", err)
				}
			default:
				return
			}
		}
	}()
	for {
		for len(n.pool) < cap(n.pool) && n.ctx.Err() == nil {
			att, err := n.attach(n.ctx)
			if err != nil {
				if n.ctx.Err() == nil {
					n.log.Warn("prepare a network namespace", "err", err)
				}
				break // tried again at the next take
			}
			n.pool <- att
		}
		select {
		case <-n.refill:
		case <-n.ctx.Done():
			return
		}
		// CNI's plugins take cores: refill once starts have been quiet for a while,
		// not during the rollout that took from the pool.
		for quiet := false; !quiet; {
			select {
			case <-n.refill:
			case <-time.After(refillQuiet):
				quiet = true
			case <-n.ctx.Done():
				return
			}
		}
	}
}

// refillQuiet is how long no instance may have taken a namespace or become ready
// before the pool is refilled.
const refillQuiet = 500 * time.Millisecond

// replenish asks the filler to fill the pool up again.
func (n *network) replenish() {
	if n.refill == nil {
		return
	}
	select {
	case n.refill <- struct{}{}:
	default:
	}
}

// close stops the filler and tears the pooled namespaces down. The instances'
// namespaces stay: their containers run on, and the next start adopts them.
func (n *network) close() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
}

// attach creates a namespace with an id of its own and attaches it (CNI ADD). On
// error nothing is left.
func (n *network) attach(ctx context.Context) (attachment, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return n.attachAs(ctx, "bex-netns-"+hex.EncodeToString(rnd[:]))
}

func (n *network) attachAs(ctx context.Context, id string) (attachment, error) {
	att := attachment{id: id, dir: filepath.Join(n.dir, id)}
	if err := os.MkdirAll(att.dir, 0o700); err != nil {
		return attachment{}, err
	}
	if err := tenantnet.NewNetNS(att.netns()); err != nil {
		_ = os.RemoveAll(att.dir)
		return attachment{}, err
	}
	if err := mountSysfs(att.netns(), att.sysfs()); err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), id)
		return attachment{}, err
	}
	addr, err := n.cni.Attach(ctx, id, att.netns())
	if err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), id)
		return attachment{}, err
	}
	att.addr = addr
	return att, nil
}

// setup gives container ctrID a network namespace, from the pool when it has one,
// and writes its resolv.conf (the host's, read now) and hosts. On error nothing
// is left.
func (n *network) setup(ctx context.Context, ctrID string) (attachment, error) {
	if n.mode == NetworkHost {
		return attachment{addr: loopback}, nil
	}
	var att attachment
	select {
	case att = <-n.pool:
		// Refilled once the instance is ready (replenish): CNI's plugins would
		// otherwise take cores from the start they are meant to speed up.
	default:
		n.replenish()
		var err error
		if att, err = n.attach(ctx); err != nil {
			return attachment{}, err
		}
	}
	if err := n.writeFiles(att, ctrID); err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), att.id)
		return attachment{}, err
	}
	return att, nil
}

// restore gives back an adopted container the namespace it names, when that is
// gone (bex up releases the namespaces when it stops, a reboot unmounts them):
// the old attachment is released (CNI DEL, so host-local frees the address it
// keeps on disk) and a new one made at the same path, which the container's spec
// names, with a new address. It reports whether it made one.
func (n *network) restore(ctx context.Context, id, ctrID string) (attachment, bool, error) {
	if n.mode == NetworkHost || id == "" {
		return attachment{}, false, nil
	}
	att := attachment{id: id, dir: filepath.Join(n.dir, id)}
	if tenantnet.IsNetNS(att.netns()) {
		return att, false, nil
	}
	if err := n.teardown(ctx, id); err != nil {
		return attachment{}, false, err
	}
	att, err := n.attachAs(ctx, id)
	if err != nil {
		return attachment{}, false, err
	}
	if err := n.writeFiles(att, ctrID); err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), id)
		return attachment{}, false, err
	}
	return att, true, nil
}

// allowLinks lets the instance in att reach the databases listening on ports
// of the apps' gateway (links.go). On the host network there is nothing to
// open: every instance reaches every listener.
func (n *network) allowLinks(ctx context.Context, att attachment, ports []uint16) error {
	if n.mode == NetworkHost || len(ports) == 0 {
		return nil
	}
	return n.tn.AllowLinks(ctx, att.id, att.addr, ports)
}

// writeFiles writes the namespace's resolv.conf (the host's, read now) and hosts.
func (n *network) writeFiles(att attachment, ctrID string) error {
	host, err := os.ReadFile("/etc/resolv.conf")
	if err == nil {
		err = os.WriteFile(att.resolvConf(), tenantnet.ResolvConf(host), 0o644)
	}
	if err == nil {
		err = os.WriteFile(att.hosts(), tenantnet.Hosts(ctrID, att.addr), 0o644)
	}
	if err != nil {
		return fmt.Errorf("network files of %s: %w", ctrID, err)
	}
	return nil
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

// teardown detaches namespace id (CNI DEL), unmounts it and removes its
// directory. Idempotent: a namespace never attached, or already torn down, is
// fine.
func (n *network) teardown(ctx context.Context, id string) error {
	if n.mode == NetworkHost || id == "" {
		return nil
	}
	dir := filepath.Join(n.dir, id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	att := attachment{dir: dir}
	var errs []error
	// First: RemoveAll below must never walk into a mounted sysfs.
	if err := unmountSysfs(att.sysfs()); err != nil {
		return err
	}
	// The links go before the address is given back: the next namespace that
	// gets it must not inherit them.
	if err := n.tn.RemoveLinks(ctx, id); err != nil {
		return err
	}
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

// cleanup tears down every namespace that no container in live (namespace ids)
// uses: left by a crash between setup and the container's creation, by a
// container deleted while bex was down, or the pool of a previous run.
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
			n.log.Warn("tear down a network namespace that no container uses", "netns", e.Name(), "err", err)
		} else {
			n.log.Info("tore down a network namespace that no container uses", "netns", e.Name())
		}
	}
}
