package tenantnet_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/testenv"
)

// egressConfig has chains and subnets of its own, so that another test (or
// another bex on this machine) installing the default chains meanwhile cannot
// change the rules this test checks.
func egressConfig(t testing.TB) tenantnet.Config {
	cfg := tenantnet.DefaultConfig()
	cfg.ChainPrefix, cfg.AppsSubnet, cfg.BuildsSubnet = "BEXEGRESS", "10.233.0.0/16", "10.234.0.0/16"
	// The machine's resolver on a private address (here 10.255.255.53) is the
	// LAN's DNS server in these tests.
	cfg.ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	return cfg
}

func install(t testing.TB, cfg tenantnet.Config) {
	t.Helper()
	if err := tenantnet.Install(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tenantnet.Remove(context.Background(), cfg) })
}

// tenant is a namespace attached to cfg's apps network, as an app instance's
// (or a build step's: the same plugin, the same rules) is.
func tenant(t testing.TB, cfg tenantnet.Config) (string, netip.Addr) {
	t.Helper()
	n, err := tenantnet.NewAppsNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := fmt.Sprintf("tenantnet-egress-%d", time.Now().UnixNano())
	path := filepath.Join(t.TempDir(), "netns")
	if err := tenantnet.NewNetNS(path); err != nil {
		t.Fatal(err)
	}
	addr, err := n.Attach(ctx, id, path)
	if err != nil {
		_ = tenantnet.RemoveNetNS(path)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Detach(ctx, id, path); err != nil {
			t.Error(err)
		}
		if err := tenantnet.RemoveNetNS(path); err != nil {
			t.Error(err)
		}
	})
	return path, addr
}

// lanAddrs are a private, a CGNAT, a link-local and another private address,
// random so that two runs on one machine do not meet (none is the metadata
// address: a route to it would take the machine's own away on a cloud).
func lanAddrs() []netip.Addr {
	r := func(lo, hi int) byte { return byte(lo + rand.IntN(hi-lo+1)) }
	return []netip.Addr{
		netip.AddrFrom4([4]byte{10, 211, r(0, 255), r(1, 254)}),
		netip.AddrFrom4([4]byte{192, 168, r(0, 255), r(1, 254)}),
		netip.AddrFrom4([4]byte{100, 100, r(0, 255), r(1, 254)}),
		netip.AddrFrom4([4]byte{169, 254, r(1, 168), r(1, 254)}),
	}
}

// TestTenantEgress: from a tenant's namespace the LAN (private, CGNAT and
// link-local addresses in a namespace the test makes) is closed, while the
// internet stand-in and DNS answer, and the resolver on a private address
// answers on port 53 only; with a range allowed, that range is reached and no
// other.
func TestTenantEgress(t *testing.T) {
	cfg := egressConfig(t)
	addrs := lanAddrs()
	resolver, private, cgnat, linkLocal := addrs[0], addrs[1], addrs[2], addrs[3]
	if err := os.WriteFile(cfg.ResolvConf, []byte("nameserver 127.0.0.53\nnameserver "+resolver.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lan := testenv.StartLAN(t, addrs...)
	out := testenv.StartOutside(t)
	install(t, cfg)
	ns, _ := tenant(t, cfg)

	probe := func() map[string]string {
		got := map[string]string{}
		err := tenantnet.InNetNS(ns, func() error {
			for _, a := range addrs {
				got["tcp "+a.String()] = tcpProbe(netip.AddrPortFrom(a, uint16(lan.TCPPort)))
			}
			got["outside"] = tcpProbe(netip.AddrPortFrom(out.Addr, uint16(out.TCPPort)))
			got["dns outside"] = dnsProbe(out.Addr, out.Name)
			got["dns resolver"] = dnsProbe(resolver, "db."+testenv.Domain)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("tenant's report: %q", got)
		return got
	}
	want := func(got map[string]string, key, value string) {
		t.Helper()
		if got[key] != value {
			t.Errorf("%s: %q, want %q", key, got[key], value)
		}
	}
	closed := func(got map[string]string, a netip.Addr) {
		t.Helper()
		// Refused at once by the host (an ICMP error), not timed out.
		if v := got["tcp "+a.String()]; !strings.Contains(v, "no route to host") {
			t.Errorf("tcp %s: %q, want it refused (no route to host)", a, v)
		}
	}

	got := probe()
	for _, a := range addrs {
		closed(got, a)
	}
	want(got, "outside", testenv.Greeting)
	want(got, "dns outside", out.Addr.String())
	want(got, "dns resolver", resolver.String())
	if p := lan.Peers(); len(p) != 0 {
		t.Errorf("the LAN accepted connections from %v", p)
	}

	// The operator opens one range: that range is reached, no other.
	cfg.AllowEgress = []netip.Prefix{netip.PrefixFrom(private, 32)}
	install(t, cfg)
	got = probe()
	want(got, "tcp "+private.String(), "lan "+private.String())
	for _, a := range []netip.Addr{resolver, cgnat, linkLocal} {
		closed(got, a)
	}
	want(got, "outside", testenv.Greeting)
	want(got, "dns resolver", resolver.String())
	if p := lan.Peers(); len(p) != 1 {
		t.Errorf("the LAN accepted %v, want one connection (to %s)", p, private)
	}
}

// TestForgedSources: a tenant that writes UDP datagrams with a forged source (a
// raw socket, as a build step with CAP_NET_RAW may) reaches neither a host
// listener (INPUT) nor an allowed LAN target (FORWARD), whichever source it
// claims: the host's address, another tenant's, the Internet's. The controls: the
// same raw socket with the tenant's own source, and a plain UDP socket, reach the
// allowed target.
func TestForgedSources(t *testing.T) {
	cfg := egressConfig(t)
	if err := os.WriteFile(cfg.ResolvConf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := lanAddrs()
	allowed := addrs[1]
	cfg.AllowEgress = []netip.Prefix{netip.PrefixFrom(allowed, 32)}
	lan := testenv.StartLAN(t, addrs...)
	out := testenv.StartOutside(t)
	install(t, cfg)
	ns, self := tenant(t, cfg)
	_, other := tenant(t, cfg)

	// A host listener on every address, which records what it receives.
	host, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	hostPort := host.LocalAddr().(*net.UDPAddr).Port

	hostIP := hostAddress(t)
	gateway := netip.MustParsePrefix(cfg.AppsSubnet).Masked().Addr().Next()
	forged := []netip.Addr{hostIP, gateway, other, out.Addr, addrs[0], netip.MustParseAddr("203.0.113.9")}
	err = tenantnet.InNetNS(ns, func() error {
		for _, src := range forged {
			for _, dst := range []netip.Addr{gateway, hostIP} {
				if err := sendRawUDP(src, netip.AddrPortFrom(dst, uint16(hostPort)), "forged from "+src.String()); err != nil {
					return err
				}
			}
			if err := sendRawUDP(src, netip.AddrPortFrom(allowed, uint16(lan.UDPPort)), "forged from "+src.String()); err != nil {
				return err
			}
		}
		// The controls, sent after the forged datagrams on the same veth: once
		// they arrived, so would have those.
		if err := sendRawUDP(self, netip.AddrPortFrom(allowed, uint16(lan.UDPPort)), "raw honest"); err != nil {
			return err
		}
		c, err := net.Dial("udp4", netip.AddrPortFrom(allowed, uint16(lan.UDPPort)).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("honest"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the honest datagrams at the allowed LAN target", func() error {
		seen := map[string]bool{}
		for _, d := range lan.Datagrams() {
			seen[d.Payload] = true
		}
		if !seen["raw honest"] || !seen["honest"] {
			return fmt.Errorf("received %v", lan.Datagrams())
		}
		return nil
	})
	for _, d := range lan.Datagrams() {
		if strings.HasPrefix(d.Payload, "forged") {
			t.Errorf("the LAN target received a forged datagram: %+v", d)
		}
	}
	if got := queued(t, host); len(got) != 0 {
		t.Errorf("the host listener received forged datagrams: %v", got)
	}
}

// queued returns the datagrams waiting at pc. The caller knows they arrived,
// if they were to: what was sent after them on the same path was received.
func queued(t *testing.T, pc net.PacketConn) []string {
	t.Helper()
	var got []string
	buf := make([]byte, 1500)
	for {
		// Not a wait for an event: a datagram in the socket's queue is read at once.
		_ = pc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, from, err := pc.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%q from %s", buf[:n], from))
	}
}

// tcpProbe connects to ap and returns the first line it reads, or the error.
func tcpProbe(ap netip.AddrPort) string {
	c, err := net.DialTimeout("tcp4", ap.String(), 3*time.Second)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(line)
}

// dnsProbe asks server (UDP, port 53) for name's A record and returns the
// answer's address, or the error. A socket of the calling thread: Go's resolver
// would ask from goroutines of other threads, outside the namespace.
func dnsProbe(server netip.Addr, name string) string {
	c, err := net.Dial("udp4", netip.AddrPortFrom(server, 53).String())
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(name, ".") {
		q = append(append(q, byte(len(l))), l...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	if _, err := c.Write(q); err != nil {
		return err.Error()
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return err.Error()
	}
	if n < len(q)+16 || binary.BigEndian.Uint16(buf[6:8]) != 1 {
		return fmt.Sprintf("no answer: % x", buf[:n])
	}
	a, _ := netip.AddrFromSlice(buf[n-4 : n])
	return a.String()
}

// sendRawUDP writes one UDP datagram from src (whatever it is) to dst through a
// raw socket of the calling thread's namespace: the IP header is the caller's
// (IP_HDRINCL), the kernel fills in its checksum and length only.
func sendRawUDP(src netip.Addr, dst netip.AddrPort, payload string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	udpLen := 8 + len(payload)
	pkt := make([]byte, 20+udpLen)
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pkt[2:4], uint16(len(pkt)))
	s, d := src.As4(), dst.Addr().As4()
	copy(pkt[12:16], s[:])
	copy(pkt[16:20], d[:])
	binary.BigEndian.PutUint16(pkt[20:22], 40000)
	binary.BigEndian.PutUint16(pkt[22:24], dst.Port())
	binary.BigEndian.PutUint16(pkt[24:26], uint16(udpLen)) // checksum 0: none, as IPv4 allows
	copy(pkt[28:], payload)
	if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: d}); err != nil && !errors.Is(err, unix.EHOSTUNREACH) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("sendto %s from %s: %w", dst, src, err)
	}
	return nil
}

// TestNoIPv6FromTenants: a tenant has IPv6 off, yet the host's end of its veth
// has a link-local address where the host's [::] listeners answer; a tenant
// that writes an IPv6 frame on a packet socket (CAP_NET_RAW, as a build step
// has) reaches no host listener that way. The control: the same writer, with an
// IPv4 frame from the tenant's own address, reaches an allowed LAN target.
func TestNoIPv6FromTenants(t *testing.T) {
	cfg := egressConfig(t)
	if err := os.WriteFile(cfg.ResolvConf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lan := testenv.StartLAN(t, lanAddrs()[1])
	cfg.AllowEgress = []netip.Prefix{netip.PrefixFrom(lan.Addrs[0], 32)}
	install(t, cfg)
	ns, self := tenant(t, cfg)

	// The host's end: the route to the tenant names it.
	route, err := exec.Command("ip", "-o", "route", "get", self.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("ip route get: %v: %s", err, route)
	}
	m := regexp.MustCompile(` dev (\S+)`).FindSubmatch(route)
	if m == nil {
		t.Fatalf("no device in %q", route)
	}
	hostIf, err := net.InterfaceByName(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	var hostLL netip.Addr
	testenv.Eventually(t, 10*time.Second, "the host veth's link-local address, past duplicate address detection", func() error {
		out, err := exec.Command("ip", "-6", "-o", "addr", "show", "dev", hostIf.Name, "scope", "link").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := regexp.MustCompile(`inet6 (fe80::[0-9a-f:]+)/64`).FindSubmatch(out)
		if f == nil || strings.Contains(string(out), "tentative") {
			return fmt.Errorf("%q", out)
		}
		hostLL = netip.MustParseAddr(string(f[1]))
		return nil
	})
	host, err := net.ListenPacket("udp6", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	hostPort := uint16(host.LocalAddr().(*net.UDPAddr).Port)

	err = tenantnet.InNetNS(ns, func() error {
		eth0, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		src := netip.MustParseAddr("fe80::1")
		if err := sendFrame(eth0, hostIf.HardwareAddr, 0x86dd, ipv6UDP(src, hostLL, hostPort, "ipv6 from a tenant")); err != nil {
			return err
		}
		return sendFrame(eth0, hostIf.HardwareAddr, 0x0800, ipv4UDP(self, netip.AddrPortFrom(lan.Addrs[0], uint16(lan.UDPPort)), "packet socket honest"))
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the control frame at the LAN target", func() error {
		for _, d := range lan.Datagrams() {
			if d.Payload == "packet socket honest" {
				return nil
			}
		}
		return fmt.Errorf("received %v", lan.Datagrams())
	})
	if got := queued(t, host); len(got) != 0 {
		t.Errorf("the host's [::] listener received %v", got)
	}
}

// sendFrame writes one Ethernet frame on ifc through a packet socket of the
// calling thread's namespace.
func sendFrame(ifc *net.Interface, dst net.HardwareAddr, ethType uint16, payload []byte) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	frame := append(append(append([]byte{}, dst...), ifc.HardwareAddr...), byte(ethType>>8), byte(ethType))
	frame = append(frame, payload...)
	sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6, Protocol: ethType<<8 | ethType>>8}
	copy(sa.Addr[:], dst)
	return unix.Sendto(fd, frame, 0, sa)
}

// ipv4UDP is an IPv4 packet with a UDP datagram, its header checksum computed
// (a packet socket writes it as it is).
func ipv4UDP(src netip.Addr, dst netip.AddrPort, payload string) []byte {
	pkt := make([]byte, 28+len(payload))
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pkt[2:4], uint16(len(pkt)))
	s, d := src.As4(), dst.Addr().As4()
	copy(pkt[12:16], s[:])
	copy(pkt[16:20], d[:])
	binary.BigEndian.PutUint16(pkt[10:12], checksum(pkt[:20]))
	binary.BigEndian.PutUint16(pkt[20:22], 40000)
	binary.BigEndian.PutUint16(pkt[22:24], dst.Port())
	binary.BigEndian.PutUint16(pkt[24:26], uint16(8+len(payload)))
	copy(pkt[28:], payload)
	return pkt
}

// ipv6UDP is an IPv6 packet with a UDP datagram, its checksum (which IPv6
// requires) computed over the pseudo-header.
func ipv6UDP(src, dst netip.Addr, port uint16, payload string) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:2], 40000)
	binary.BigEndian.PutUint16(udp[2:4], port)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(udp)))
	copy(udp[8:], payload)
	s, d := src.As16(), dst.As16()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, unix.IPPROTO_UDP)
	binary.BigEndian.PutUint16(udp[6:8], checksum(append(pseudo, udp...)))
	hdr := make([]byte, 40)
	hdr[0] = 0x60
	binary.BigEndian.PutUint16(hdr[4:6], uint16(len(udp)))
	hdr[6], hdr[7] = unix.IPPROTO_UDP, 255
	copy(hdr[8:24], s[:])
	copy(hdr[24:40], d[:])
	return append(hdr, udp...)
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// TestBuildStepEgress runs the probe as a RUN step of a real build, on a
// buildkitd of its own whose builds network has the test's chains and one LAN
// address allowed: the step reaches the internet stand-in, resolves a name at the
// resolver on a private address, reaches the allowed address and none of the
// others (private, CGNAT, link-local), nor the resolver on another port.
func TestBuildStepEgress(t *testing.T) {
	c := testenv.SharedContainerd(t)
	testenv.SharedBusybox(t)
	cfg := egressConfig(t)
	addrs := lanAddrs()
	resolver, allowed := addrs[0], addrs[1]
	if err := os.WriteFile(cfg.ResolvConf, []byte("nameserver "+resolver.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.AllowEgress = []netip.Prefix{netip.PrefixFrom(allowed, 32)}
	lan := testenv.StartLAN(t, addrs...)
	out := testenv.StartOutside(t)
	t.Cleanup(func() { _ = tenantnet.Remove(context.Background(), cfg) })
	bk, err := testenv.StartBuildkitd(t.TempDir(), c, testenv.WithTenantNet(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bk.Stop() })

	dir := t.TempDir()
	var probes strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&probes, "t %s %s %d; ", a, a, lan.TCPPort)
	}
	dockerfile := fmt.Sprintf(`FROM busybox
RUN echo nonce %d; \
    t() { echo "probe $1: $(nc -w 2 $2 $3 </dev/null 2>&1 | head -c 200 | tr '\n' ' ')"; }; \
    %s \
    t outside %s %d; \
    echo "probe dns: $(nslookup db.%s %s 2>&1 | tr '\n' ' ')"; \
    echo "probe addr: $(ip -4 -o addr show 2>&1 | tr '\n' ' ')"
`, time.Now().UnixNano(), probes.String(), out.Addr, out.TCPPort, testenv.Domain, resolver)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, log, err := bk.BuildImage(ctx, dir, dir, fmt.Sprintf("docker.io/library/tenantnet-egress:%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		if rest, ok := strings.CutPrefix(l, "probe "); ok {
			if k, v, ok := strings.Cut(rest, ":"); ok {
				lines[k] = strings.TrimSpace(v)
			}
		}
	}
	t.Logf("build step's report: %q", lines)
	if !strings.Contains(lines["addr"], strings.TrimSuffix(cfg.BuildsSubnet, "0.0/16")) {
		t.Fatalf("the build step is not on the test's builds subnet %s: %q", cfg.BuildsSubnet, lines["addr"])
	}
	for _, a := range addrs {
		got, ok := lines[a.String()]
		switch {
		case !ok:
			t.Errorf("no probe line for %s in the build log:\n%s", a, log)
		case a == allowed && got != "lan "+a.String():
			t.Errorf("the build step did not reach the allowed %s: %q", a, got)
		case a != allowed && strings.Contains(got, "lan "):
			t.Errorf("the build step reached %s: %q", a, got)
		}
	}
	if lines["outside"] != testenv.Greeting {
		t.Errorf("the build step did not reach the outside: %q", lines["outside"])
	}
	if !strings.Contains(lines["dns"], "Address: "+resolver.String()) {
		t.Errorf("the build step did not resolve at %s: %q", resolver, lines["dns"])
	}
	if p := lan.Peers(); len(p) != 1 {
		t.Errorf("the LAN accepted %v, want one connection (to %s)", p, allowed)
	}
}
