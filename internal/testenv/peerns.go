package testenv

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// peerNS is a network namespace of a test's, joined to the host by a veth pair
// with a /30 of 198.<second>.x.y (RFC 2544's benchmarking range, never routed
// outside): the host's end .1, the namespace's .2 and its default route back to
// the host. Outside and LAN are made of one each.
type peerNS struct {
	name     string // the namespace, as ip netns names it
	hostIf   string // the host's end of the veth
	hostAddr netip.Addr
	nsAddr   netip.Addr
	ip       func(args ...string) // runs ip, failing the test
}

// newPeerNS makes the namespace (named prefix + a random tag, its interfaces
// ifPrefix + tag + h|n); it and the veth go when the test ends.
func newPeerNS(t testing.TB, second byte, prefix, ifPrefix string) peerNS {
	t.Helper()
	third, fourth := rand.IntN(256), 4*rand.IntN(64)
	tag := fmt.Sprintf("%02x%02x", third, fourth)
	p := peerNS{
		name:     prefix + tag,
		hostIf:   ifPrefix + tag + "h",
		hostAddr: netip.AddrFrom4([4]byte{198, second, byte(third), byte(fourth + 1)}),
		nsAddr:   netip.AddrFrom4([4]byte{198, second, byte(third), byte(fourth + 2)}),
	}
	nsIf := ifPrefix + tag + "n"
	p.ip = func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip := p.ip
	ip("netns", "add", p.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.name).Run() })
	ip("link", "add", p.hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", p.hostIf).Run() })
	ip("link", "set", nsIf, "netns", p.name)
	ip("addr", "add", p.hostAddr.String()+"/30", "dev", p.hostIf)
	ip("link", "set", p.hostIf, "up")
	ip("-n", p.name, "addr", "add", p.nsAddr.String()+"/30", "dev", nsIf)
	ip("-n", p.name, "link", "set", nsIf, "up")
	ip("-n", p.name, "link", "set", "lo", "up")
	ip("-n", p.name, "route", "add", "default", "via", p.hostAddr.String())
	return p
}
