package tenantnet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"bex.co/bex/internal/nonpublic"
)

// Rule is one iptables rule: its table, chain and match/target arguments.
type Rule struct {
	Table, Chain string
	Args         []string
}

func (r Rule) String() string {
	return fmt.Sprintf("-t %s -A %s %s", r.Table, r.Chain, strings.Join(r.Args, " "))
}

// Chains returns bex's chains: filter INPUT and FORWARD, nat POSTROUTING. (The
// others are the raw table's, the host ports', the databases' and the links'.)
func (cfg Config) Chains() (input, forward, postrouting string) {
	p := cfg.ChainPrefix
	return p + "-INPUT", p + "-FORWARD", p + "-POSTROUTING"
}

// rawChain is bex's chain in the raw table's PREROUTING, where what comes in on
// a tenant's interface is checked before conntrack sees it (spoofRule).
func (cfg Config) rawChain() string { return cfg.ChainPrefix + "-PREROUTING" }

// hostPortsChain holds the host's TCP ports that tenants may reach (AllowHostPorts),
// jumped to from the INPUT chain before its DROP.
func (cfg Config) hostPortsChain() string { return cfg.ChainPrefix + "-HOST-PORTS" }

// jumps are the rules in the built-in chains that send traffic to bex's chains.
// They are inserted first, so that no broader ACCEPT before them lets a tenant
// through (and, in nat PREROUTING, so that a database's port on the apps'
// gateway is led to the database before any other DNAT of that port).
func (cfg Config) jumps() []Rule {
	in, fwd, post := cfg.Chains()
	return []Rule{
		{"raw", "PREROUTING", []string{"-j", cfg.rawChain()}},
		{"filter", "INPUT", []string{"-j", in}},
		{"filter", "FORWARD", []string{"-j", fwd}},
		{"nat", "POSTROUTING", []string{"-j", post}},
		{"nat", "PREROUTING", []string{"-j", cfg.databasesChain()}},
	}
}

// TenantInterfaces matches the host's ends of the tenants' veth pairs: CNI's
// ptp names them veth<random hex> (containernetworking's ip.SetupVeth), for the
// apps' namespaces and for buildkitd's build steps alike.
const TenantInterfaces = "veth+"

// spoofRule drops, before conntrack, a packet that comes in on a tenant's
// interface from an address whose route does not go back out of that interface
// (a strict reverse-path check, -m rpfilter): from a tenant namespace, the one
// source that passes is the namespace's own address (ptp's /32 route on its
// veth). A forged source, be it the host's address, another tenant's or
// anyone's, goes no further: neither to the host's listeners (INPUT) nor
// anywhere else (FORWARD), so that the rules below, which match the source
// subnet, match exactly the traffic of the tenants' interfaces.
func (cfg Config) spoofRule() Rule {
	return Rule{"raw", cfg.rawChain(), []string{"-i", TenantInterfaces, "-m", "rpfilter", "--invert", "-j", "DROP"}}
}

// Rules6 are the IPv6 rules (ip6tables), in the raw table's chain of the same
// name. Tenants have no IPv6: it is off on their interface (the tuning plugin).
// But the host's end of their veth pair has a link-local address, on which the
// host's listeners on [::] answer, and a tenant with CAP_NET_RAW (a build step)
// can write IPv6 frames on a packet socket all the same; so every IPv6 packet
// that comes in on a tenant's interface is dropped, before conntrack.
func (cfg Config) Rules6() []Rule {
	return []Rule{{"raw", cfg.rawChain(), []string{"-i", TenantInterfaces, "-j", "DROP"}}}
}

// Resolvers are the nameservers of the host's resolv.conf that tenants must
// reach on port 53, whatever else is closed to them.
type Resolvers struct {
	// Local are addresses of this host (a stub resolver on a LAN address): the
	// INPUT rules open port 53 on them.
	Local []netip.Addr
	// Forwarded are elsewhere: this machine's 10.255.255.53, a router's
	// 192.168.1.1. The FORWARD rules open port 53 on them before the
	// non-public ranges are closed.
	Forwarded []netip.Addr
}

// Rules returns the rules of bex's chains, in order, with res the host's
// resolvers (Config.HostResolvers).
func (cfg Config) Rules(res Resolvers) []Rule {
	in, fwd, post := cfg.Chains()
	established := []string{"-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"}
	dns := func(chain, s string, rs []netip.Addr) []Rule {
		var out []Rule
		for _, r := range rs {
			for _, proto := range []string{"udp", "tcp"} {
				out = append(out, Rule{"filter", chain, []string{"-s", s, "-d", r.String(), "-p", proto, "--dport", "53", "-j", "ACCEPT"}})
			}
		}
		return out
	}
	rules := []Rule{cfg.spoofRule()}
	for _, s := range cfg.subnets() {
		// Replies to what the host opened: the edge and the health checks connect to
		// instances, and the SYN-ACK comes back here.
		rules = append(rules, Rule{"filter", in, append([]string{"-s", s}, established...)})
		rules = append(rules, dns(in, s, res.Local)...)
		// The host's public ports (the edge's), so that an app may call another app,
		// or itself, at its public address on this machine: AllowHostPorts fills
		// that chain.
		rules = append(rules, Rule{"filter", in, []string{"-s", s, "-j", cfg.hostPortsChain()}})
		rules = append(rules, Rule{"filter", in, []string{"-s", s, "-j", "DROP"}})
	}
	// The links to databases (AllowLinks) first: the one tenant-to-tenant
	// traffic that passes, an app and the database it reaches at the apps'
	// gateway (links.go).
	rules = append(rules, cfg.linksJump())
	for _, s := range cfg.subnets() {
		for _, d := range cfg.subnets() {
			rules = append(rules, Rule{"filter", fwd, []string{"-s", s, "-d", d, "-j", "DROP"}})
		}
	}
	for _, s := range cfg.subnets() {
		rules = append(rules,
			Rule{"filter", fwd, append([]string{"-d", s}, established...)},
			Rule{"filter", fwd, []string{"-d", s, "-j", "DROP"}},
		)
		// Outbound: the Internet, not the LAN. The resolvers first (port 53 only),
		// then the ranges the operator opened, then every non-public range is
		// refused with an ICMP error, so that a connection fails at once ("no route
		// to host") rather than after a timeout.
		rules = append(rules, dns(fwd, s, res.Forwarded)...)
		for _, a := range cfg.AllowEgress {
			rules = append(rules, Rule{"filter", fwd, []string{"-s", s, "-d", a.Masked().String(), "-j", "ACCEPT"}})
		}
		for _, b := range nonpublic.IPv4() {
			rules = append(rules, Rule{"filter", fwd, []string{"-s", s, "-d", b.String(), "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"}})
		}
		rules = append(rules, Rule{"filter", fwd, []string{"-s", s, "-j", "ACCEPT"}})
	}
	for _, s := range cfg.subnets() {
		rules = append(rules, Rule{"nat", post, []string{"-s", s, "!", "-d", s, "-j", "MASQUERADE"}})
	}
	return rules
}

// HostResolvers returns the IPv4 nameservers of the host's resolv.conf, those
// that are addresses of this host apart from the others. Loopback ones are left
// out: a namespace has a loopback of its own and cannot reach the host's.
func (cfg Config) HostResolvers() (Resolvers, error) {
	data, err := os.ReadFile(cfg.ResolvConf)
	if err != nil {
		return Resolvers{}, err
	}
	local := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return Resolvers{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			local[p.Addr().Unmap()] = true
		}
	}
	var out Resolvers
	for _, ns := range nameservers(data) {
		switch {
		case !ns.Is4() || ns.IsLoopback():
		case local[ns]:
			out.Local = append(out.Local, ns)
		default:
			out.Forwarded = append(out.Forwarded, ns)
		}
	}
	return out, nil
}

func nameservers(resolvConf []byte) []netip.Addr {
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(resolvConf))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// Install adds bex's chains and the jumps to them where missing, writes the
// chains' rules, and turns on IPv4 forwarding. The rules of each table are
// written in one iptables-restore transaction, which replaces what the chains held
// (an older bex's rules, in an older order) without a moment in which they are
// empty; the host ports' chain keeps what AllowHostPorts put there, the
// databases' and links' chains what Expose and AllowLinks put there. It is safe to
// call at every start and from several processes at once (the xtables lock).
func Install(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	resolvers, err := cfg.HostResolvers()
	if err != nil {
		return fmt.Errorf("tenant network: host resolvers: %w", err)
	}
	in, fwd, post := cfg.Chains()
	for _, c := range []struct{ table, chain string }{{"filter", cfg.hostPortsChain()}, {"filter", cfg.linksChain()}, {"nat", cfg.databasesChain()}, {"filter", in}, {"filter", fwd}, {"nat", post}, {"raw", cfg.rawChain()}} {
		if err := iptables(ctx, "-t", c.table, "-n", "-L", c.chain); err != nil {
			if err := iptables(ctx, "-t", c.table, "-N", c.chain); err != nil && !strings.Contains(err.Error(), "already exists") {
				return fmt.Errorf("tenant network: create chain %s: %w", c.chain, err)
			}
		}
	}
	if err := restore(ctx, []string{in, fwd, post, cfg.rawChain()}, cfg.Rules(resolvers)); err != nil {
		return err
	}
	for _, r := range cfg.jumps() {
		if err := ensure(ctx, r, true); err != nil {
			return err
		}
	}
	if err := installIPv6(ctx, cfg); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("tenant network: enable IPv4 forwarding: %w", err)
	}
	return nil
}

// ensure appends r (or inserts it first) unless it exists.
func ensure(ctx context.Context, r Rule, first bool) error {
	if iptables(ctx, append([]string{"-t", r.Table, "-C", r.Chain}, r.Args...)...) == nil {
		return nil
	}
	op := []string{"-t", r.Table, "-A", r.Chain}
	if first {
		op = []string{"-t", r.Table, "-I", r.Chain, "1"}
	}
	if err := iptables(ctx, append(op, r.Args...)...); err != nil {
		return fmt.Errorf("tenant network: add rule %s: %w", r, err)
	}
	return nil
}

// Remove deletes the jumps to bex's chains and the chains. What is not there is
// not an error.
func Remove(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	var errs []error
	for _, r := range cfg.jumps() {
		if err := deleteRule(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	in, fwd, post := cfg.Chains()
	// The INPUT and FORWARD chains first: they jump to the host ports' and the
	// links' chains, which can only go once nothing refers to them.
	for _, c := range []struct{ table, chain string }{{"filter", in}, {"filter", fwd}, {"nat", post}, {"raw", cfg.rawChain()}, {"filter", cfg.hostPortsChain()}, {"filter", cfg.linksChain()}, {"nat", cfg.databasesChain()}} {
		if iptables(ctx, "-t", c.table, "-n", "-L", c.chain) != nil {
			continue
		}
		if err := iptables(ctx, "-t", c.table, "-F", c.chain); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := iptables(ctx, "-t", c.table, "-X", c.chain); err != nil {
			errs = append(errs, err)
		}
	}
	if ipv6On() {
		raw6 := Rule{"raw", "PREROUTING", []string{"-j", cfg.rawChain()}}
		for xtables(ctx, "ip6tables", append([]string{"-t", "raw", "-C", "PREROUTING"}, raw6.Args...)...) == nil {
			if err := xtables(ctx, "ip6tables", append([]string{"-t", "raw", "-D", "PREROUTING"}, raw6.Args...)...); err != nil {
				errs = append(errs, err)
				break
			}
		}
		if xtables(ctx, "ip6tables", "-t", "raw", "-n", "-L", cfg.rawChain()) == nil {
			errs = append(errs, xtables(ctx, "ip6tables", "-t", "raw", "-F", cfg.rawChain()), xtables(ctx, "ip6tables", "-t", "raw", "-X", cfg.rawChain()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tenant network: remove rules: %w", err)
	}
	return nil
}

// AllowHostPorts lets tenants reach these TCP ports of the host (on any of its
// addresses): the edge's public ports, so that an app calls another app at its
// public URL when both run on this machine, as from anywhere else. Install must
// have run. Adding a port that is allowed already changes nothing.
func AllowHostPorts(ctx context.Context, cfg Config, ports ...int) error {
	cfg = cfg.withDefaults()
	for _, p := range ports {
		if err := ensure(ctx, hostPortRule(cfg, p), false); err != nil {
			return fmt.Errorf("tenant network: allow host port %d: %w", p, err)
		}
	}
	return nil
}

// DisallowHostPorts takes back what AllowHostPorts allowed; a port that is not
// allowed is not an error.
func DisallowHostPorts(ctx context.Context, cfg Config, ports ...int) error {
	cfg = cfg.withDefaults()
	var errs []error
	for _, p := range ports {
		if err := deleteRule(ctx, hostPortRule(cfg, p)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteRule deletes every copy of r; none is not an error.
func deleteRule(ctx context.Context, r Rule) error {
	for iptables(ctx, append([]string{"-t", r.Table, "-C", r.Chain}, r.Args...)...) == nil {
		if err := iptables(ctx, append([]string{"-t", r.Table, "-D", r.Chain}, r.Args...)...); err != nil {
			return err
		}
	}
	return nil
}

func hostPortRule(cfg Config, port int) Rule {
	return Rule{"filter", cfg.hostPortsChain(), []string{"-p", "tcp", "--dport", strconv.Itoa(port), "-j", "ACCEPT"}}
}

// restore replaces the rules of chains (which exist) with rules, one
// iptables-restore transaction per table: with --noflush, a chain line empties
// that chain and leaves the rest of the table alone.
func restore(ctx context.Context, chains []string, rules []Rule) error {
	var b strings.Builder
	for _, table := range []string{"raw", "filter", "nat"} {
		var body strings.Builder
		for _, r := range rules {
			if r.Table == table {
				fmt.Fprintf(&body, "-A %s %s\n", r.Chain, strings.Join(r.Args, " "))
			}
		}
		fmt.Fprintf(&b, "*%s\n", table)
		for _, c := range chains {
			if strings.Contains(body.String(), "-A "+c+" ") {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
		}
		b.WriteString(body.String())
		b.WriteString("COMMIT\n")
	}
	cmd := exec.CommandContext(ctx, "iptables-restore", "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tenant network: iptables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// iptables runs iptables with the xtables lock waited for.
func iptables(ctx context.Context, args ...string) error { return xtables(ctx, "iptables", args...) }

// xtables runs iptables or ip6tables with the xtables lock waited for.
func xtables(ctx context.Context, bin string, args ...string) error {
	out, err := exec.CommandContext(ctx, bin, append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ipv6On reports whether the kernel has IPv6: booted with ipv6.disable=1 it has
// no /proc/sys/net/ipv6, no ip6tables and no IPv6 path to close.
func ipv6On() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// installIPv6 writes Rules6 (one ip6tables-restore transaction) and the jump to
// them, as Install does for IPv4.
func installIPv6(ctx context.Context, cfg Config) error {
	if !ipv6On() {
		return nil
	}
	chain := cfg.rawChain()
	if xtables(ctx, "ip6tables", "-t", "raw", "-n", "-L", chain) != nil {
		if err := xtables(ctx, "ip6tables", "-t", "raw", "-N", chain); err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("tenant network: create chain %s (IPv6): %w", chain, err)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*raw\n:%s - [0:0]\n", chain)
	for _, r := range cfg.Rules6() {
		fmt.Fprintf(&b, "-A %s %s\n", r.Chain, strings.Join(r.Args, " "))
	}
	b.WriteString("COMMIT\n")
	cmd := exec.CommandContext(ctx, "ip6tables-restore", "-w", "5", "--noflush")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tenant network: ip6tables-restore: %w: %s", err, strings.TrimSpace(string(out)))
	}
	jump := []string{"PREROUTING", "-j", chain}
	if xtables(ctx, "ip6tables", append([]string{"-t", "raw", "-C"}, jump...)...) != nil {
		if err := xtables(ctx, "ip6tables", "-t", "raw", "-I", "PREROUTING", "1", "-j", chain); err != nil {
			return fmt.Errorf("tenant network: add rule -j %s (IPv6): %w", chain, err)
		}
	}
	return nil
}
