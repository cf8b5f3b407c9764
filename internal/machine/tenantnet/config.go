package tenantnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Names of the two CNI networks. host-local keeps its allocations under
// /var/lib/cni/networks/<name>, shared by every bex on the machine that uses the
// network, so that two of them never hand out one address twice (the /32 routes
// of ptp would collide).
const (
	AppsNetwork   = "bex-apps"
	BuildsNetwork = "bex-builds"
)

// Config configures the tenants' network. DefaultConfig gives the defaults, and a
// zero field means its default: the functions of this package and Validate fill
// them in.
type Config struct {
	// AppsSubnet holds the app instances' addresses. Default 10.89.0.0/16.
	AppsSubnet string
	// BuildsSubnet holds the build steps' addresses. Default 10.90.0.0/16.
	BuildsSubnet string
	// PluginDir holds the CNI plugins. Default /usr/lib/cni (Debian's
	// containernetworking-plugins).
	PluginDir string
	// ChainPrefix names bex's iptables chains: <prefix>-INPUT, <prefix>-FORWARD,
	// <prefix>-POSTROUTING. Default "BEX".
	ChainPrefix string
	// ResolvConf is the host's resolver configuration, read for the resolver's
	// address. Default /etc/resolv.conf.
	ResolvConf string
	// AllowEgress are the ranges tenants may reach although they are not the
	// Internet (internal/nonpublic): `bex up --allow-tenant-egress`, a database
	// on the LAN, say. IPv4 only, as tenants have no IPv6. Every installer of the
	// rules must be given the same ranges, or the last one to install wins.
	AllowEgress []netip.Prefix
}

// WithDefaults returns cfg with every unset field set to its default.
func (cfg Config) WithDefaults() Config { return cfg.withDefaults() }

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns cfg with every unset field set to its default.
func (cfg Config) withDefaults() Config {
	if cfg.AppsSubnet == "" {
		cfg.AppsSubnet = "10.89.0.0/16"
	}
	if cfg.BuildsSubnet == "" {
		cfg.BuildsSubnet = "10.90.0.0/16"
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = "/usr/lib/cni"
	}
	if cfg.ChainPrefix == "" {
		cfg.ChainPrefix = "BEX"
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	return cfg
}

var chainPrefix = regexp.MustCompile(`^[A-Z][A-Z0-9-]{0,15}$`)

// Validate reports every field that is wrong, its zero fields taken as their
// defaults, each naming its field.
func (cfg Config) Validate() error {
	cfg = cfg.withDefaults()
	var errs []error
	apps, err := netip.ParsePrefix(cfg.AppsSubnet)
	if err != nil || !apps.Addr().Is4() || apps.Bits() > 24 {
		errs = append(errs, fmt.Errorf("Config.AppsSubnet %q: want an IPv4 CIDR of /24 or larger", cfg.AppsSubnet))
	}
	builds, err2 := netip.ParsePrefix(cfg.BuildsSubnet)
	if err2 != nil || !builds.Addr().Is4() || builds.Bits() > 24 {
		errs = append(errs, fmt.Errorf("Config.BuildsSubnet %q: want an IPv4 CIDR of /24 or larger", cfg.BuildsSubnet))
	}
	if err == nil && err2 == nil && apps.Overlaps(builds) {
		errs = append(errs, fmt.Errorf("Config.AppsSubnet %s and Config.BuildsSubnet %s: overlap", apps, builds))
	}
	if !chainPrefix.MatchString(cfg.ChainPrefix) {
		errs = append(errs, fmt.Errorf("Config.ChainPrefix %q: want up to 16 capital letters, digits or '-'", cfg.ChainPrefix))
	}
	for _, p := range cfg.AllowEgress {
		if !p.IsValid() || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("Config.AllowEgress %s: want an IPv4 CIDR (tenants have no IPv6)", p))
		}
	}
	if !filepath.IsAbs(cfg.PluginDir) {
		errs = append(errs, fmt.Errorf("Config.PluginDir %q: want an absolute path", cfg.PluginDir))
	}
	return errors.Join(errs...)
}

// ParseEgress parses the ranges of `--allow-tenant-egress`: CIDR[,CIDR...] of
// IPv4 ranges; a bare address is its /32. Empty is none.
func ParseEgress(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			if a, err2 := netip.ParseAddr(f); err2 == nil {
				p, err = netip.PrefixFrom(a, a.BitLen()), nil
			}
		}
		if err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("%q: want IPv4 CIDRs separated by commas, e.g. 192.168.1.0/24,10.0.5.7/32 (tenants have no IPv6)", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// subnets are the tenant subnets, apps first.
func (cfg Config) subnets() []string { return []string{cfg.AppsSubnet, cfg.BuildsSubnet} }

// CheckPlugins reports a missing CNI plugin with the package to install.
func (cfg Config) CheckPlugins() error {
	cfg = cfg.withDefaults()
	for _, p := range []string{"ptp", "host-local", "loopback", "tuning"} {
		if _, err := os.Stat(filepath.Join(cfg.PluginDir, p)); err != nil {
			return fmt.Errorf("CNI plugin %s is missing in %s: install containernetworking-plugins", p, cfg.PluginDir)
		}
	}
	return nil
}

// AppsConfList is the CNI configuration of the app instances' network.
// Its interface is eth0: Network loads it before the loopback network, and
// go-cni names interfaces by their network's place in the list.
func (cfg Config) AppsConfList() []byte {
	return confList(AppsNetwork, cfg.withDefaults().AppsSubnet, "eth0")
}

// BuildsConfList is the CNI configuration of the build steps' network.
// Its interface is eth1: buildkitd's CNI provider loads the loopback network
// first (util/network/cniprovider), so this one is the second of go-cni's list.
func (cfg Config) BuildsConfList() []byte {
	return confList(BuildsNetwork, cfg.withDefaults().BuildsSubnet, "eth1")
}

// confList is a ptp network on subnet: a veth pair per namespace, the host's end
// with the gateway address, a /32 route to the container on the host and a
// default route in the container; IPv6 off on the container's interface ifname
// (the tuning plugin fails the ADD if that interface does not exist, so a change
// of name is loud). ipMasq is
// off: masquerading is one rule of bex's own for the whole subnet (see Rules),
// not a chain per container that a crash could leave behind.
func confList(name, subnet, ifname string) []byte {
	type m = map[string]any
	list := m{
		"cniVersion": "1.0.0",
		"name":       name,
		"plugins": []m{
			{
				"type":   "ptp",
				"ipMasq": false,
				"ipam": m{
					"type":   "host-local",
					"ranges": [][]m{{{"subnet": subnet}}},
					"routes": []m{{"dst": "0.0.0.0/0"}},
				},
			},
			{
				"type":   "tuning",
				"sysctl": m{"net.ipv6.conf." + ifname + ".disable_ipv6": "1"},
			},
		},
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		panic(err) // a literal map of strings always marshals
	}
	return data
}

// WriteBuildsConfList writes the builds' network to path (which must end in
// .conflist, the suffix by which buildkitd takes it for a list of plugins).
func (cfg Config) WriteBuildsConfList(path string) error {
	if filepath.Ext(path) != ".conflist" {
		return fmt.Errorf("CNI configuration %s: the name must end in .conflist", path)
	}
	// Read by buildkitd, as root.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, cfg.BuildsConfList(), 0o600)
}
