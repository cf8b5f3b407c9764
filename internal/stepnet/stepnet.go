package stepnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"bex.co/bex/internal/nonpublic"
)

// TableName names the nftables tables Apply writes (one of the inet family, one of
// the bridge family).
const TableName = "bex-build-steps"

// Config says what the rules are made of.
type Config struct {
	// Bridge is the bridge the steps' interfaces are attached to (the conflist's
	// "bridge"; buildkitd's default is buildkit0).
	Bridge string
	// Subnet is the steps' addresses (the conflist's host-local range): their
	// traffic is masqueraded to the pod's address.
	Subnet netip.Prefix
	// Resolvers are the DNS servers a step may reach on port 53 (the pod's
	// /etc/resolv.conf, which buildkitd gives each step).
	Resolvers []netip.Addr
	// Allow are ranges a step may reach although the list refuses them (a
	// package mirror on the LAN).
	Allow []netip.Prefix
	// Block are addresses refused besides the list's: the node's own (a public
	// address, on a cloud server).
	Block []netip.Prefix
}

// DefaultConfig returns the defaults of a buildkitd pod's steps' network (bex
// build-network's flags): BuildKit's bridge and the conflist's range;
// Resolvers, Allow and Block are empty.
func DefaultConfig() Config {
	return Config{Bridge: "buildkit0", Subnet: netip.MustParsePrefix("10.10.0.0/16")}
}

func (c Config) validate() error {
	var errs []error
	if c.Bridge == "" || len(c.Bridge) >= unix.IFNAMSIZ {
		errs = append(errs, fmt.Errorf("bridge %q: want an interface name of 1 to %d bytes", c.Bridge, unix.IFNAMSIZ-1))
	}
	if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() {
		errs = append(errs, fmt.Errorf("subnet %v: want an IPv4 CIDR", c.Subnet))
	}
	for _, r := range c.Resolvers {
		if !r.Is4() {
			errs = append(errs, fmt.Errorf("resolver %v: only IPv4 resolvers are supported (steps have no IPv6)", r))
		}
	}
	for _, p := range slices.Concat(c.Allow, c.Block) {
		if !p.IsValid() || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("range %v: want an IPv4 CIDR", p))
		}
	}
	return errors.Join(errs...)
}

// Apply writes the rules into the current network namespace, replacing any that an
// earlier Apply wrote, in one netlink transaction.
func Apply(c Config) error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("build steps' network: %w", err)
	}
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("build steps' network: nftables: %w", err)
	}
	inet := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	bridge := &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName}
	for _, t := range []*nftables.Table{inet, bridge} {
		// add + delete + add: the table exists empty afterwards whether or not
		// it did before (nft's idiom for replacing a table in one batch).
		conn.AddTable(t)
		conn.DelTable(t)
		conn.AddTable(t)
	}
	add := func(t *nftables.Table, name string, typ nftables.ChainType, hook *nftables.ChainHook, prio int32, rules ...[]expr.Any) {
		ch := &nftables.Chain{Name: name, Table: t}
		if hook != nil { // a base chain; without a hook, one that rules jump to
			ch.Type, ch.Hooknum, ch.Priority = typ, hook, nftables.ChainPriorityRef(nftables.ChainPriority(prio))
		}
		ch = conn.AddChain(ch)
		for _, r := range rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	add(inet, refuseChain, "", nil, 0, refuseRules()...)
	// Ahead of the filter priority (0), where iptables-nft's and the CNI
	// plugins' chains are: not that it matters for a reject, which is final.
	add(inet, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, -10, forwardRules(c)...)
	add(inet, "input", nftables.ChainTypeFilter, nftables.ChainHookInput, -10,
		rule(fromBridge(c.Bridge), reject()),
	)
	add(inet, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, 100,
		rule(ipv4(), daddrOrSaddrIn(srcOffset, c.Subnet), outOfBridge(c.Bridge), []expr.Any{&expr.Masq{}}),
	)
	// Frames the bridge forwards from one step's port to another's never reach
	// the inet hooks: the bridge family's forward hook sees them, and drops them
	// all. The pod's namespace has no other bridge (buildkitd makes only the
	// steps'), and the kernel here refuses a match on the bridge's name (meta
	// ibrname: "operation not supported" in a forward chain of the bridge family).
	add(bridge, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, -10,
		[]expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}},
	)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("build steps' network: writing the nftables rules: %w", err)
	}
	return nil
}

// forwardRules decide what a step's packet that the pod would route on may reach.
// The first match is final: accept for a resolver's port 53 and an allowed range,
// reject for the list and Block, accept (the Internet) otherwise.
func forwardRules(c Config) [][]expr.Any {
	br := fromBridge(c.Bridge)
	rules := [][]expr.Any{
		// Steps get no IPv6 address; whatever IPv6 they send is refused.
		rule(br, meta(expr.MetaKeyNFPROTO, []byte{unix.NFPROTO_IPV6}), reject()),
	}
	for _, r := range c.Resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rules = append(rules, rule(br, ipv4(), daddrOrSaddrIn(dstOffset, netip.PrefixFrom(r, 32)),
				meta(expr.MetaKeyL4PROTO, []byte{proto}), dport(53), accept()))
		}
	}
	for _, p := range c.Allow {
		rules = append(rules, rule(br, ipv4(), daddrOrSaddrIn(dstOffset, p), accept()))
	}
	for _, p := range slices.Concat(nonpublic.IPv4(), c.Block) {
		rules = append(rules, rule(br, ipv4(), daddrOrSaddrIn(dstOffset, p), reject()))
	}
	return rules
}

// rule joins the expressions of a rule.
func rule(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

func meta(key expr.MetaKey, want []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

func fromBridge(name string) []expr.Any { return meta(expr.MetaKeyIIFNAME, ifname(name)) }

func outOfBridge(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(name)},
	}
}

func ipv4() []expr.Any { return meta(expr.MetaKeyNFPROTO, []byte{unix.NFPROTO_IPV4}) }

// Offsets of the addresses in the IPv4 header.
const (
	srcOffset = 12
	dstOffset = 16
)

// daddrOrSaddrIn matches an IPv4 packet whose address at offset (srcOffset,
// dstOffset) is in p.
func daddrOrSaddrIn(offset uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	net4 := p.Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net4[:]},
	}
}

// dport matches the transport header's destination port (after a check of the
// protocol: UDP and TCP keep it at the same offset).
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

// refuseChain refuses at once, so that a step's connection fails with
// "connection refused" or "no route to host" instead of waiting out a timeout: a
// TCP reset for TCP, ICMP "administratively prohibited" for the rest.
const refuseChain = "refuse"

func refuseRules() [][]expr.Any {
	return [][]expr.Any{
		rule(meta(expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP}),
			[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}},
	}
}

func reject() []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: refuseChain}}
}

// ifname is an interface name as the kernel compares it: NUL-padded to IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}
