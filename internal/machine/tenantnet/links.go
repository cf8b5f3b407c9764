package tenantnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// databasesChain holds, in the nat table, the DNAT of each database's port on
// the apps' gateway to the database instance (Expose), jumped to from
// PREROUTING.
func (cfg Config) databasesChain() string { return cfg.ChainPrefix + "-DATABASES" }

// linksChain holds, in the filter table, the instances that may reach a
// database's port (AllowLinks), jumped to from the first rule of the FORWARD
// chain, before tenant-to-tenant traffic is dropped.
func (cfg Config) linksChain() string { return cfg.ChainPrefix + "-LINKS" }

// linksJump sends the traffic between two app instances to the links' chain:
// the one traffic a link accepts (an app and the database instance it reaches
// through the DNAT). Internet traffic, the bulk of what is forwarded, does not
// walk a chain that grows with every linked instance.
func (cfg Config) linksJump() Rule {
	_, fwd, _ := cfg.Chains()
	return Rule{"filter", fwd, []string{"-s", cfg.AppsSubnet, "-d", cfg.AppsSubnet, "-j", cfg.linksChain()}}
}

// AppsGateway is the apps' gateway: the first host address of AppsSubnet, which
// ptp gives the host's end of every app instance's veth. Databases are reached
// there. The zero Addr if AppsSubnet is not a prefix (Validate says why).
func (cfg Config) AppsGateway() netip.Addr {
	p, err := netip.ParsePrefix(cfg.withDefaults().AppsSubnet)
	if err != nil {
		return netip.Addr{}
	}
	return p.Masked().Addr().Next()
}

// linkName is what a database's name (Expose) and a link's owner (AllowLinks)
// may be: they are the rules' comments, which is how the rules are found again.
var linkName = regexp.MustCompile(`^[a-z0-9./-]{1,200}$`)

func checkLinkName(what, name string) error {
	if !linkName.MatchString(name) {
		return fmt.Errorf("%s %q: want 1 to 200 of a-z, 0-9, '.', '/', '-'", what, name)
	}
	return nil
}

// appsInstance checks that a is an app instance's possible address: in
// AppsSubnet, and neither the subnet's own address nor the gateway (the host).
func (cfg Config) appsInstance(what string, a netip.Addr) error {
	apps, err := netip.ParsePrefix(cfg.AppsSubnet)
	if err != nil {
		return fmt.Errorf("Config.AppsSubnet %q: %w", cfg.AppsSubnet, err)
	}
	apps = apps.Masked()
	if !a.IsValid() || !apps.Contains(a) || a == apps.Addr() || a == cfg.AppsGateway() {
		return fmt.Errorf("%s %s: want an app instance's address in %s", what, a, apps)
	}
	return nil
}

// DatabaseRule is the DNAT that leads the apps' connections to port of the
// apps' gateway to the database instance at target, commented with name. Only
// connections from the apps' subnet are led: a build step (or anything else)
// that connects to that port reaches the host, whose rules decide.
func (cfg Config) DatabaseRule(name string, port uint16, target netip.AddrPort) (Rule, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Rule{}, fmt.Errorf("tenant network: %w", err)
	}
	if err := checkLinkName("database name", name); err != nil {
		return Rule{}, err
	}
	if port == 0 {
		return Rule{}, fmt.Errorf("database %s: port 0", name)
	}
	if err := cfg.appsInstance("database "+name+": target", target.Addr()); err != nil {
		return Rule{}, err
	}
	if target.Port() == 0 {
		return Rule{}, fmt.Errorf("database %s: target %s: port 0", name, target)
	}
	return Rule{"nat", cfg.databasesChain(), []string{
		"-s", cfg.AppsSubnet, "-d", cfg.AppsGateway().String() + "/32", "-p", "tcp", "--dport", strconv.Itoa(int(port)),
		"-m", "comment", "--comment", name, "-j", "DNAT", "--to-destination", target.String(),
	}}, nil
}

// LinkRules are the rules that let the instance at src, whose network
// namespace is owner, reach the databases on ports of the apps' gateway: one
// per port (duplicates once, in order), commented with owner. They match the
// connection's original tuple in conntrack (src to the gateway's port), which
// DNAT does not change: both directions of a connection the instance opened to
// a database's port pass, and nothing else does, not even a connection of its
// to the database instance's own address.
func (cfg Config) LinkRules(owner string, src netip.Addr, ports []uint16) ([]Rule, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tenant network: %w", err)
	}
	if err := checkLinkName("link owner", owner); err != nil {
		return nil, err
	}
	if err := cfg.appsInstance("links of "+owner+": source", src); err != nil {
		return nil, err
	}
	var rules []Rule
	var seen []uint16
	for _, p := range ports {
		if p == 0 {
			return nil, fmt.Errorf("links of %s: port 0", owner)
		}
		if slices.Contains(seen, p) {
			continue
		}
		seen = append(seen, p)
		rules = append(rules, Rule{"filter", cfg.linksChain(), []string{
			"-m", "conntrack", "--ctorigsrc", src.String(), "--ctorigdst", cfg.AppsGateway().String(), "--ctorigdstport", strconv.Itoa(int(p)),
			"-m", "comment", "--comment", owner, "-j", "ACCEPT",
		}})
	}
	return rules, nil
}

// linksMu serializes the read-modify-write of the databases' and links' chains
// within a process. Between processes, each change is one iptables command
// under the xtables lock, deletions name the rule rather than its position,
// and each process changes the rules of its own owners and names.
var linksMu sync.Mutex

// Expose leads the apps' connections to port of the apps' gateway to the
// database instance at target (which must be in AppsSubnet). Exposing what is
// exposed changes nothing; exposing name anew (another port, another target)
// replaces its rule, the new one added before the old goes. A port that
// another name holds is an error that names it. Install must have run.
func (cfg Config) Expose(ctx context.Context, name string, port uint16, target netip.AddrPort) error {
	cfg = cfg.withDefaults()
	want, err := cfg.DatabaseRule(name, port, target)
	if err != nil {
		return err
	}
	linksMu.Lock()
	defer linksMu.Unlock()
	rules, err := listRules(ctx, want.Table, want.Chain)
	if err != nil {
		return err
	}
	present := false
	var stale [][]string
	for _, r := range rules {
		c := comment(r)
		dport, _ := flagValue(r, "--dport")
		if dport == strconv.Itoa(int(port)) && c != name {
			return fmt.Errorf("tenant network: database %s: port %d is held by %q", name, port, c)
		}
		if c != name {
			continue
		}
		if !present && cfg.isDatabaseRule(r, port, target) {
			present = true
			continue
		}
		stale = append(stale, r)
	}
	if !present {
		if err := iptables(ctx, append([]string{"-t", want.Table, "-A", want.Chain}, want.Args...)...); err != nil {
			return fmt.Errorf("tenant network: expose database %s: %w", name, err)
		}
	}
	return deleteAll(ctx, want.Table, want.Chain, stale)
}

// isDatabaseRule reports whether r, as iptables lists it, is DatabaseRule's.
func (cfg Config) isDatabaseRule(r []string, port uint16, target netip.AddrPort) bool {
	s, _ := flagValue(r, "-s")
	d, _ := flagValue(r, "-d")
	dport, _ := flagValue(r, "--dport")
	to, _ := flagValue(r, "--to-destination")
	j, _ := flagValue(r, "-j")
	apps, _ := netip.ParsePrefix(cfg.AppsSubnet)
	return samePrefix(s, apps.Masked()) && samePrefix(d, netip.PrefixFrom(cfg.AppsGateway(), 32)) &&
		dport == strconv.Itoa(int(port)) && to == target.String() && j == "DNAT" && !slices.Contains(r, "!")
}

// Unexpose deletes name's rules; none is not an error. Connections that are
// open go on (conntrack keeps their DNAT); new ones are not led any more.
func (cfg Config) Unexpose(ctx context.Context, name string) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	if err := checkLinkName("database name", name); err != nil {
		return err
	}
	linksMu.Lock()
	defer linksMu.Unlock()
	return deleteWhere(ctx, "nat", cfg.databasesChain(), func(r []string) bool { return comment(r) == name })
}

// AllowLinks lets the instance at src, in the network namespace owner, reach the
// databases on ports of the apps' gateway, and no others: owner's rules for
// other ports go (those it keeps are not touched, so its open connections to
// them go on). The rules of another owner for src go too: host-local never
// gives one address to two live namespaces, so they are what a namespace that
// is gone left behind, and would let the new one in. Install must have run.
func (cfg Config) AllowLinks(ctx context.Context, owner string, src netip.Addr, ports []uint16) error {
	cfg = cfg.withDefaults()
	want, err := cfg.LinkRules(owner, src, ports)
	if err != nil {
		return err
	}
	chain := cfg.linksChain()
	linksMu.Lock()
	defer linksMu.Unlock()
	rules, err := listRules(ctx, "filter", chain)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	var stale [][]string
	for _, r := range rules {
		origSrc, _ := flagValue(r, "--ctorigsrc")
		mine := comment(r) == owner
		if !mine && !sameAddr(origSrc, src) {
			continue
		}
		origDst, _ := flagValue(r, "--ctorigdst")
		port, _ := flagValue(r, "--ctorigdstport")
		if mine && !present[port] && sameAddr(origSrc, src) && sameAddr(origDst, cfg.AppsGateway()) && wants(want, port) && !slices.Contains(r, "!") {
			present[port] = true
			continue
		}
		stale = append(stale, r)
	}
	for _, w := range want {
		if port, _ := flagValue(w.Args, "--ctorigdstport"); present[port] {
			continue
		}
		if err := iptables(ctx, append([]string{"-t", w.Table, "-A", w.Chain}, w.Args...)...); err != nil {
			return fmt.Errorf("tenant network: links of %s: %w", owner, err)
		}
	}
	return deleteAll(ctx, "filter", chain, stale)
}

// wants reports whether one of the link rules is for port.
func wants(rules []Rule, port string) bool {
	for _, w := range rules {
		if p, _ := flagValue(w.Args, "--ctorigdstport"); p == port {
			return true
		}
	}
	return false
}

// RemoveLinks deletes owner's rules; none is not an error. Its open connections
// to databases are cut: their packets meet the tenant-to-tenant drop.
func (cfg Config) RemoveLinks(ctx context.Context, owner string) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	if err := checkLinkName("link owner", owner); err != nil {
		return err
	}
	linksMu.Lock()
	defer linksMu.Unlock()
	if iptables(ctx, "-t", "filter", "-n", "-L", cfg.linksChain()) != nil {
		// Remove took the chain away with every rule in it: a namespace torn
		// down after that has none left to remove.
		return nil
	}
	return deleteWhere(ctx, "filter", cfg.linksChain(), func(r []string) bool { return comment(r) == owner })
}

// SweepLinks deletes the rules of every owner for which keep returns false
// (asked once per owner): what namespaces that are gone left behind. Rules
// without an owner are not bex's and stay. The chain is the machine's, shared by
// every bex on it: keep must answer for all of their owners (Attached does),
// not for one process's, or a bex that starts takes the links of another's
// running instances.
func (cfg Config) SweepLinks(ctx context.Context, keep func(owner string) bool) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	linksMu.Lock()
	defer linksMu.Unlock()
	kept := map[string]bool{}
	return deleteWhere(ctx, "filter", cfg.linksChain(), func(r []string) bool {
		owner := comment(r)
		if owner == "" {
			return false
		}
		k, asked := kept[owner]
		if !asked {
			k = keep(owner)
			kept[owner] = k
		}
		return !k
	})
}

// deleteWhere deletes the rules of chain for which match is true.
func deleteWhere(ctx context.Context, table, chain string, match func([]string) bool) error {
	rules, err := listRules(ctx, table, chain)
	if err != nil {
		return err
	}
	return deleteAll(ctx, table, chain, slices.DeleteFunc(rules, func(r []string) bool { return !match(r) }))
}

// deleteAll deletes rules (as listRules returns them) from chain. A rule that
// is gone already (another process deleted it meanwhile) is not an error.
func deleteAll(ctx context.Context, table, chain string, rules [][]string) error {
	var errs []error
	for _, r := range rules {
		err := iptables(ctx, append([]string{"-t", table, "-D", chain}, r...)...)
		if err != nil && iptables(ctx, append([]string{"-t", table, "-C", chain}, r...)...) == nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tenant network: %w", err)
	}
	return nil
}

// listRules returns the rules of chain as `iptables -S` writes them, each the
// arguments after "-A <chain>", unquoted: what -C and -D take back.
func listRules(ctx context.Context, table, chain string) ([][]string, error) {
	out, err := exec.CommandContext(ctx, "iptables", "-w", "5", "-t", table, "-S", chain).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		return nil, fmt.Errorf("tenant network: iptables -t %s -S %s (has Install run?): %w: %s", table, chain, err, strings.TrimSpace(string(stderr)))
	}
	var rules [][]string
	for _, line := range strings.Split(string(out), "\n") {
		args, err := splitRule(line)
		if err != nil {
			return nil, fmt.Errorf("tenant network: chain %s: %w", chain, err)
		}
		if len(args) >= 2 && args[0] == "-A" && args[1] == chain {
			rules = append(rules, args[2:])
		}
	}
	return rules, nil
}

// splitRule splits a line of `iptables -S` into its arguments: words, or
// double-quoted strings in which a backslash escapes the next character (how
// iptables writes a comment that is not a plain word).
func splitRule(line string) ([]string, error) {
	var args []string
	for i := 0; i < len(line); {
		switch {
		case line[i] == ' ' || line[i] == '\t':
			i++
		case line[i] == '"':
			var b strings.Builder
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				b.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("unterminated quote in %q", line)
			}
			i++
			args = append(args, b.String())
		default:
			j := i
			for j < len(line) && line[j] != ' ' && line[j] != '\t' {
				j++
			}
			args = append(args, line[i:j])
			i = j
		}
	}
	return args, nil
}

// flagValue is the argument that follows flag in args.
func flagValue(args []string, flag string) (string, bool) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1], true
		}
	}
	return "", false
}

// comment is the rule's comment: the database's name or the link's owner.
func comment(args []string) string {
	c, _ := flagValue(args, "--comment")
	return c
}

// sameAddr reports whether s, as iptables writes an address (with or without
// /32), is a.
func sameAddr(s string, a netip.Addr) bool {
	return samePrefix(s, netip.PrefixFrom(a, a.BitLen()))
}

// samePrefix reports whether s, as iptables writes an address or a range, is p.
func samePrefix(s string, p netip.Prefix) bool {
	if !strings.Contains(s, "/") {
		s += "/32"
	}
	q, err := netip.ParsePrefix(s)
	return err == nil && q == p
}
