package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/stepnet"
)

// buildNetworkCmd is `bex build-network`: the init container of buildkitd's pod on
// a cluster (infra/bex/buildkitd.yaml) writes, in the pod's network namespace, the
// rules that confine the build steps' bridge (internal/stepnet). It needs
// CAP_NET_ADMIN in that namespace and nothing else.
type buildNetworkCmd struct {
	out        io.Writer
	bridge     string
	subnet     string
	resolvConf string
	allow      egressFlag
	block      []string
	cniLinks   string
}

// cniPlugins are the CNI plugins buildkitd's steps' network uses, by the names
// the conflist and BuildKit's loopback network give them, and where BuildKit's
// image keeps them (its own builds of the plugins, renamed).
var cniPlugins = map[string]string{
	"bridge":     "/usr/bin/buildkit-cni-bridge",
	"host-local": "/usr/bin/buildkit-cni-host-local",
	"loopback":   "/usr/bin/buildkit-cni-loopback",
}

func (c *buildNetworkCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "build-network",
		Short: "Confine the build steps' network in buildkitd's pod (a cluster's init container)",
		Long: "Writes the nftables rules of the current network namespace (buildkitd's pod) that let build steps on " +
			"buildkitd's bridge reach the Internet and the resolvers' port 53 only: not the pod, not each other, " +
			"not the cluster, the node, the LAN or the cloud metadata address.",
		Args: cobra.NoArgs,
	}
	d := stepnet.DefaultConfig()
	f := cmd.Flags()
	f.StringVar(&c.bridge, "bridge", d.Bridge, "the steps' bridge (the \"bridge\" of buildkitd's CNI conflist)")
	f.StringVar(&c.subnet, "subnet", d.Subnet.String(), "the steps' addresses (the conflist's host-local range), masqueraded to the pod's")
	f.StringVar(&c.resolvConf, "resolv-conf", "/etc/resolv.conf", "the resolv.conf whose nameservers steps may reach on port 53 (buildkitd gives steps the pod's)")
	f.Var(&c.allow, "allow", "IPv4 ranges, CIDR[,CIDR...], that steps may reach although they are not the Internet (a package mirror on the LAN)")
	f.StringSliceVar(&c.block, "block", nil, "addresses or CIDRs closed to steps besides the non-public ranges: the node's own (a public address), e.g. --block=$(NODE_IP)")
	f.StringVar(&c.cniLinks, "cni-links", "", "a directory to fill with links to BuildKit's image's CNI plugins (bridge, host-local, loopback -> /usr/bin/buildkit-cni-*), buildkitd's cniBinaryPath; empty: none")
	return cmd
}

func (c *buildNetworkCmd) run(context.Context) error {
	subnet, err := netip.ParsePrefix(c.subnet)
	if err != nil {
		return fmt.Errorf("--subnet %q: want a CIDR such as 10.10.0.0/16", c.subnet)
	}
	cfg := stepnet.Config{Bridge: c.bridge, Subnet: subnet, Allow: c.allow}
	for _, b := range c.block {
		b = strings.TrimSpace(b)
		if b == "" {
			continue
		}
		p, err := netip.ParsePrefix(b)
		if err != nil {
			a, aerr := netip.ParseAddr(b)
			if aerr != nil {
				return fmt.Errorf("--block %q: want an address or a CIDR", b)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if !p.Addr().Is4() {
			continue // steps have no IPv6: stepnet refuses all of it
		}
		cfg.Block = append(cfg.Block, p)
	}
	res, err := tenantnet.Config{ResolvConf: c.resolvConf}.HostResolvers()
	if err != nil {
		return fmt.Errorf("--resolv-conf: %w", err)
	}
	// A resolver that is the pod's own address is not reachable from a step
	// (nothing of the pod is): buildkitd's pods use the cluster's DNS Service.
	cfg.Resolvers = res.Forwarded
	if err := stepnet.Apply(cfg); err != nil {
		return err
	}
	if c.cniLinks != "" {
		// The targets are paths of buildkitd's container, which mounts the
		// directory: they need not exist here.
		for name, target := range cniPlugins {
			link := filepath.Join(c.cniLinks, name)
			if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if err := os.Symlink(target, link); err != nil {
				return fmt.Errorf("--cni-links: %w", err)
			}
		}
	}
	_, err = fmt.Fprintf(c.out, "build steps on %s (%s) reach the Internet and port 53 of %v only; also allowed: %v; also closed: %v\n",
		cfg.Bridge, cfg.Subnet, cfg.Resolvers, cfg.Allow, cfg.Block)
	return err
}

func (c *buildNetworkCmd) close() error { return nil }
