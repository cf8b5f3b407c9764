package stepnet_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/stepnet"
)

// world is a buildkitd pod as a cluster gives it, made of network namespaces of
// this test's: pod (buildkitd's namespace: eth0 10.244.0.5/24, the bridge
// buildkit0 10.10.0.1/16, and the rules), two steps on the bridge, and net (what
// lies beyond the pod's eth0: the cluster, the LAN, the node and "the Internet",
// as addresses on its loopback, all inside this machine).
type world struct {
	tag                      string
	pod, step1, step2, net   string
	podAddr, stepGw, step2Ad netip.Addr
	public, private, allowed netip.Addr
	node, resolver           netip.Addr
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newWorld(t *testing.T) *world {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("ip (iproute2) is needed: %v", err)
	}
	tag := fmt.Sprintf("%04x", rand.IntN(0x10000))
	w := &world{tag: tag,
		pod: "bxsp" + tag, step1: "bxs1" + tag, step2: "bxs2" + tag, net: "bxsn" + tag,
		podAddr: netip.MustParseAddr("10.244.0.5"), stepGw: netip.MustParseAddr("10.10.0.1"),
		step2Ad: netip.MustParseAddr("10.10.0.3"),
		// 198.18/15 (benchmarking) is public to the list, and routed nowhere
		// outside this machine.
		public: netip.MustParseAddr("198.18.0.7"), node: netip.MustParseAddr("198.18.0.9"),
		private: netip.MustParseAddr("10.99.0.7"), allowed: netip.MustParseAddr("10.99.0.8"),
		resolver: netip.MustParseAddr("10.99.0.53"),
	}
	for _, ns := range []string{w.pod, w.step1, w.step2, w.net} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	// pod <-> net: the pod's eth0.
	ip(t, "-n", w.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "up0", "netns", w.net)
	ip(t, "-n", w.pod, "addr", "add", w.podAddr.String()+"/24", "dev", "eth0")
	ip(t, "-n", w.pod, "link", "set", "eth0", "up")
	ip(t, "-n", w.pod, "route", "add", "default", "via", "10.244.0.1")
	ip(t, "-n", w.net, "addr", "add", "10.244.0.1/24", "dev", "up0")
	ip(t, "-n", w.net, "link", "set", "up0", "up")
	for _, a := range []netip.Addr{w.public, w.node, w.private, w.allowed, w.resolver} {
		ip(t, "-n", w.net, "addr", "add", a.String()+"/32", "dev", "lo")
	}
	// The steps' bridge, as the CNI bridge plugin makes it.
	ip(t, "-n", w.pod, "link", "add", "buildkit0", "type", "bridge")
	ip(t, "-n", w.pod, "addr", "add", w.stepGw.String()+"/16", "dev", "buildkit0")
	ip(t, "-n", w.pod, "link", "set", "buildkit0", "up")
	for i, ns := range []string{w.step1, w.step2} {
		port := fmt.Sprintf("veth%d", i)
		ip(t, "-n", w.pod, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		ip(t, "-n", w.pod, "link", "set", port, "master", "buildkit0", "up")
		ip(t, "-n", ns, "addr", "add", fmt.Sprintf("10.10.0.%d/16", i+2), "dev", "eth0")
		ip(t, "-n", ns, "link", "set", "eth0", "up")
		ip(t, "-n", ns, "route", "add", "default", "via", w.stepGw.String())
	}
	if out, err := exec.Command("ip", "netns", "exec", w.pod, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward in the pod: %v: %s", err, out)
	}
	return w
}

func (w *world) path(ns string) string { return "/run/netns/" + ns }

// listen serves TCP on addr:port in ns, answering each connection with "hi".
func listen(t *testing.T, ns string, addr netip.Addr, port int) {
	t.Helper()
	var l net.Listener
	err := tenantnet.InNetNS("/run/netns/"+ns, func() (err error) {
		l, err = net.Listen("tcp4", netip.AddrPortFrom(addr, uint16(port)).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

// dial connects from ns and reads the greeting.
func dial(ns string, addr netip.Addr, port int) error {
	return tenantnet.InNetNS("/run/netns/"+ns, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(addr, uint16(port)).String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 2)
		if _, err := c.Read(b); err != nil {
			return err
		}
		if string(b) != "hi" {
			return fmt.Errorf("read %q", b)
		}
		return nil
	})
}

// udpEcho serves one UDP port in ns, sending each datagram back.
func udpEcho(t *testing.T, ns string, addr netip.Addr, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := tenantnet.InNetNS("/run/netns/"+ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			pc.WriteTo(b[:n], from)
		}
	}()
}

func udpAsk(ns string, addr netip.Addr, port int) error {
	return tenantnet.InNetNS("/run/netns/"+ns, func() error {
		c, err := net.Dial("udp4", netip.AddrPortFrom(addr, uint16(port)).String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("q?")); err != nil {
			return err
		}
		b := make([]byte, 2)
		if _, err := c.Read(b); err != nil {
			return err
		}
		return nil
	})
}

// TestStepsReachOnlyTheInternet makes the attacks of a hostile build step from
// inside a step's namespace, before and after Apply: the pod's own listeners, a
// concurrent step, the cluster and LAN, the node, DNS off port 53; and the
// controls: the Internet (through masquerade: the target has no route back to the
// steps' subnet), an allowed range, the resolver's port 53.
func TestStepsReachOnlyTheInternet(t *testing.T) {
	w := newWorld(t)
	const port = 8080
	for _, a := range []netip.Addr{w.public, w.node, w.private, w.allowed, w.resolver} {
		listen(t, w.net, a, port)
	}
	udpEcho(t, w.net, w.resolver, 53)
	udpEcho(t, w.net, w.private, 53)
	listen(t, w.pod, w.podAddr, port)
	listen(t, w.pod, w.stepGw, port)
	listen(t, w.step2, w.step2Ad, port)

	// Without the rules, a step reaches its neighbour and the pod (the bridge
	// and the pod's own addresses) and, with masquerade missing, nothing
	// beyond: the test's world behaves as a pod does before Apply.
	if err := dial(w.step1, w.step2Ad, port); err != nil {
		t.Fatalf("without the rules, a step does not reach the other (the test's bridge is wrong): %v", err)
	}
	if err := dial(w.step1, w.podAddr, port); err != nil {
		t.Fatalf("without the rules, a step does not reach the pod's address (the test's world is wrong): %v", err)
	}
	if err := dial(w.step1, w.public, port); err == nil {
		t.Fatalf("without the rules' masquerade, a step reached the Internet (the test's world is wrong: net routes back to the steps' subnet)")
	}

	cfg := stepnet.Config{Bridge: "buildkit0", Subnet: netip.MustParsePrefix("10.10.0.0/16"),
		Resolvers: []netip.Addr{w.resolver},
		Allow:     []netip.Prefix{netip.PrefixFrom(w.allowed, 32)},
		Block:     []netip.Prefix{netip.PrefixFrom(w.node, 32)}}
	// Twice: a second Apply (a restarted init container) replaces the first.
	for range 2 {
		if err := tenantnet.InNetNS(w.path(w.pod), func() error { return stepnet.Apply(cfg) }); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := exec.Command("ip", "netns", "exec", w.pod, "nft", "list", "ruleset").CombinedOutput()
	t.Logf("the pod's ruleset:\n%s", out)

	refused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("a build step reached %s", what)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	refused("the pod's own address (buildkitd's listeners)", dial(w.step1, w.podAddr, port))
	refused("the bridge's address in the pod", dial(w.step1, w.stepGw, port))
	refused("another step on the bridge (a concurrent build)", dial(w.step1, w.step2Ad, port))
	refused("a private address (the cluster, the LAN)", dial(w.step1, w.private, port))
	refused("the node's address (Config.Block)", dial(w.step1, w.node, port))
	refused("the resolver off port 53", dial(w.step1, w.resolver, port))
	refused("port 53 of a private address that is not a resolver", udpAsk(w.step1, w.private, 53))
	if err := dial(w.step1, w.private, port); err != nil && !strings.Contains(err.Error(), "refused") {
		t.Errorf("a private address: %v, want a refusal at once (a TCP reset), not a timeout", err)
	}

	if err := dial(w.step1, w.public, port); err != nil {
		t.Errorf("a build step does not reach the Internet (masqueraded to the pod's address): %v", err)
	}
	if err := dial(w.step1, w.allowed, port); err != nil {
		t.Errorf("a build step does not reach an allowed range: %v", err)
	}
	if err := udpAsk(w.step1, w.resolver, 53); err != nil {
		t.Errorf("a build step gets no answer from the resolver's port 53: %v", err)
	}
	// The pod itself is not confined: buildkitd pulls from the cluster's registry.
	if err := dial(w.pod, w.private, port); err != nil {
		t.Errorf("the pod itself no longer reaches a private address: %v", err)
	}
}

func TestConfigIsChecked(t *testing.T) {
	err := stepnet.Apply(stepnet.Config{Bridge: "a-name-longer-than-fifteen", Subnet: netip.MustParsePrefix("fd00::/64"),
		Resolvers: []netip.Addr{netip.MustParseAddr("::1")}})
	if err == nil {
		t.Fatal("a bad config was applied")
	}
	for _, want := range []string{"bridge", "subnet", "resolver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: does not name the %s", err, want)
		}
	}
}
