package tenantnet_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestConfigDefaultsAndValidate(t *testing.T) {
	cfg := tenantnet.DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := tenantnet.Config{AppsSubnet: "10.1.0.0/16", BuildsSubnet: "10.1.2.0/24", ChainPrefix: "bex", PluginDir: "cni"}
	err := bad.Validate()
	for _, want := range []string{"overlap", "Config.ChainPrefix", "Config.PluginDir", "absolute path"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to mention %q", err, want)
		}
	}
}

// TestRules checks the order that matters: replies accepted before the drop on
// INPUT, tenant-to-tenant dropped before tenant-to-elsewhere is accepted.
func TestRules(t *testing.T) {
	cfg := tenantnet.DefaultConfig()
	var lines []string
	cfg.AllowEgress = []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}
	for _, r := range cfg.Rules(tenantnet.Resolvers{Local: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, Forwarded: []netip.Addr{netip.MustParseAddr("10.255.255.53")}}) {
		lines = append(lines, r.String())
	}
	all := strings.Join(lines, "\n")
	index := func(s string) int {
		for i, l := range lines {
			if l == s {
				return i
			}
		}
		t.Fatalf("no rule %q in\n%s", s, all)
		return -1
	}
	est := "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
	if !(index("-t filter -A BEX-INPUT -s 10.89.0.0/16 "+est) < index("-t filter -A BEX-INPUT -s 10.89.0.0/16 -d 192.0.2.53 -p udp --dport 53 -j ACCEPT") &&
		index("-t filter -A BEX-INPUT -s 10.89.0.0/16 -d 192.0.2.53 -p udp --dport 53 -j ACCEPT") < index("-t filter -A BEX-INPUT -s 10.89.0.0/16 -j BEX-HOST-PORTS") &&
		index("-t filter -A BEX-INPUT -s 10.89.0.0/16 -j BEX-HOST-PORTS") < index("-t filter -A BEX-INPUT -s 10.89.0.0/16 -j DROP")) {
		t.Errorf("INPUT order wrong:\n%s", all)
	}
	for _, pair := range [][2]string{{"10.89.0.0/16", "10.90.0.0/16"}, {"10.90.0.0/16", "10.89.0.0/16"}, {"10.89.0.0/16", "10.89.0.0/16"}} {
		drop := index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -d %s -j DROP", pair[0], pair[1]))
		if drop > index("-t filter -A BEX-FORWARD -s "+pair[0]+" -j ACCEPT") {
			t.Errorf("tenant-to-tenant drop %v after the accept:\n%s", pair, all)
		}
	}
	index("-t nat -A BEX-POSTROUTING -s 10.90.0.0/16 ! -d 10.90.0.0/16 -j MASQUERADE")
	index("-t raw -A BEX-PREROUTING -i veth+ -m rpfilter --invert -j DROP")
	// Outbound, in order: the resolver on port 53, the range the operator
	// opened, every non-public range refused, the rest accepted.
	for _, s := range []string{"10.89.0.0/16", "10.90.0.0/16"} {
		reject := func(d string) int {
			return index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -d %s -j REJECT --reject-with icmp-admin-prohibited", s, d))
		}
		dns := index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -d 10.255.255.53 -p udp --dport 53 -j ACCEPT", s))
		index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -d 10.255.255.53 -p tcp --dport 53 -j ACCEPT", s))
		allowed := index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -d 192.168.7.0/24 -j ACCEPT", s))
		accept := index(fmt.Sprintf("-t filter -A BEX-FORWARD -s %s -j ACCEPT", s))
		for _, d := range []string{"0.0.0.0/8", "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32"} {
			if r := reject(d); !(dns < r && allowed < r && r < accept) {
				t.Errorf("%s to %s is refused out of order:\n%s", s, d, all)
			}
		}
		if drop := index(fmt.Sprintf("-t filter -A BEX-FORWARD -d %s -j DROP", s)); drop > dns {
			t.Errorf("the resolver is opened to %s before the drop of what comes in:\n%s", s, all)
		}
	}
}

func TestParseEgress(t *testing.T) {
	got, err := tenantnet.ParseEgress(" 192.168.1.0/24,10.0.5.7, 172.16.3.9/16 ,")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[192.168.1.0/24 10.0.5.7/32 172.16.0.0/16]" {
		t.Errorf("ParseEgress = %v", got)
	}
	if got, err := tenantnet.ParseEgress(""); err != nil || len(got) != 0 {
		t.Errorf("ParseEgress(\"\") = %v, %v", got, err)
	}
	for _, bad := range []string{"192.168.1.0/33", "fd00::/8", "lan", "10.0.0.0/8;rm"} {
		if _, err := tenantnet.ParseEgress(bad); err == nil || !strings.Contains(err.Error(), "want IPv4 CIDRs") {
			t.Errorf("ParseEgress(%q) = %v", bad, err)
		}
	}
	cfg := tenantnet.Config{AllowEgress: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.AllowEgress") {
		t.Errorf("Validate() = %v, want the IPv6 range refused", err)
	}
}

// TestInstallIsIdempotentAndRemoveCleans installs chains of a prefix of its own
// twice (the same rules, once), then removes them.
func TestInstallIsIdempotentAndRemoveCleans(t *testing.T) {
	cfg := tenantnet.DefaultConfig()
	cfg.ChainPrefix, cfg.AppsSubnet, cfg.BuildsSubnet = "BEXTEST", "10.231.0.0/16", "10.232.0.0/16"
	ctx := context.Background()
	t.Cleanup(func() { _ = tenantnet.Remove(ctx, cfg) })
	count := func() int {
		out, err := exec.Command("iptables-save").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(out), "BEXTEST")
	}
	count6 := func() int {
		out, err := exec.Command("ip6tables-save", "-t", "raw").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(out), "BEXTEST")
	}
	if err := tenantnet.Install(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if n := count6(); n != 3 /* chain, rule, jump */ {
		t.Fatalf("BEXTEST is named %d times in ip6tables' raw table, want 3", n)
	}
	first := count()
	// Occurrences, not lines: a jump from one of bex's chains to another names
	// the prefix twice.
	res, err := cfg.HostResolvers()
	if err != nil {
		t.Fatal(err)
	}
	want := len(cfg.Rules(res)) + 5 /* jumps */ + 7 /* chain declarations */ + 3 /* rules that name two chains: each subnet's jump to the host ports, the jump to the links */
	if first != want {
		t.Fatalf("BEXTEST is named %d times after Install, want %d", first, want)
	}
	if err := tenantnet.Install(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if n, n6 := count(), count6(); n != first || n6 != 3 {
		t.Fatalf("a second Install changed the rules: %d lines, then %d (IPv6: %d)", first, n, n6)
	}
	for range 2 {
		if err := tenantnet.AllowHostPorts(ctx, cfg, 443, 8443); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != first+2 {
		t.Fatalf("two ports allowed twice: %d lines, want %d", n, first+2)
	}
	if err := tenantnet.DisallowHostPorts(ctx, cfg, 8443); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != first+1 {
		t.Fatalf("one port taken back: %d lines, want %d", n, first+1)
	}
	for _, chain := range []string{"INPUT", "FORWARD", "PREROUTING"} {
		table := "filter"
		if chain == "PREROUTING" {
			table = "raw"
		}
		out, err := exec.Command("iptables", "-w", "-t", table, "-S", chain).CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		rules := strings.Split(strings.TrimSpace(string(out)), "\n")
		found := false
		for _, r := range rules[1:] {
			if strings.HasPrefix(r, "-A "+chain+" -j BEX") {
				found = true
			} else if !found {
				t.Errorf("%s: %q comes before bex's jumps", chain, r)
			}
		}
	}
	if err := tenantnet.Remove(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if n, n6 := count(), count6(); n != 0 || n6 != 0 {
		t.Fatalf("%d lines name BEXTEST after Remove, %d of IPv6", n, n6)
	}
	if err := tenantnet.Remove(ctx, cfg); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestResolvConfAndHosts(t *testing.T) {
	got := string(tenantnet.ResolvConf([]byte("search example.com\nnameserver 127.0.0.53\nnameserver 10.255.255.53\noptions edns0\n")))
	if got != "search example.com\nnameserver 10.255.255.53\noptions edns0\n" {
		t.Fatalf("ResolvConf = %q", got)
	}
	if h := string(tenantnet.Hosts("web-1", netip.MustParseAddr("10.89.0.7"))); !strings.Contains(h, "127.0.0.1\tlocalhost") || !strings.Contains(h, "10.89.0.7\tweb-1") {
		t.Fatalf("Hosts = %q", h)
	}
}

// appInstance stands for an app instance on the apps' network: a namespace of
// its own, attached by CNI, with a listener inside that writes "app-secret".
func appInstance(t *testing.T) netip.AddrPort {
	t.Helper()
	n, err := tenantnet.NewAppsNetwork(tenantnet.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := fmt.Sprintf("tenantnet-test-%d", time.Now().UnixNano())
	path := filepath.Join(t.TempDir(), "netns")
	if err := tenantnet.NewNetNS(path); err != nil {
		t.Fatal(err)
	}
	addr, err := n.Attach(ctx, id, path)
	if err != nil {
		_ = tenantnet.RemoveNetNS(path)
		t.Fatal(err)
	}
	var l net.Listener
	err = tenantnet.InNetNS(path, func() error {
		var err error
		l, err = net.Listen("tcp4", net.JoinHostPort(addr.String(), "0"))
		return err
	})
	t.Cleanup(func() {
		if l != nil {
			l.Close()
		}
		if err := n.Detach(ctx, id, path); err != nil {
			t.Error(err)
		}
		if err := tenantnet.RemoveNetNS(path); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("app-secret\n"))
			c.Close()
		}
	}()
	return netip.AddrPortFrom(addr, uint16(l.Addr().(*net.TCPAddr).Port))
}

// TestBuildStepIsolation runs the probe as a RUN step of a real build (buildkitd's
// containerd worker on the builds' CNI network): its output in the build log
// shows that the step reaches neither the host's listeners nor an app, and that
// it reaches the outside and resolves a name.
func TestBuildStepIsolation(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	out := testenv.StartOutside(t)
	app := appInstance(t)
	var mu sync.Mutex
	var hostPeers []string
	listen := func(addr string) int {
		l, err := net.Listen("tcp4", addr)
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
				mu.Lock()
				hostPeers = append(hostPeers, c.RemoteAddr().String())
				mu.Unlock()
				_, _ = c.Write([]byte("host-secret\n"))
				c.Close()
			}
		}()
		return l.Addr().(*net.TCPAddr).Port
	}
	loPort, anyPort := listen("127.0.0.1:0"), listen("0.0.0.0:0")
	hostIP := hostAddress(t)
	cfg := tenantnet.DefaultConfig()
	// A port of the host that tenants may reach, as bex up allows the edge's.
	public, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { public.Close() })
	go func() {
		for {
			c, err := public.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("public\n"))
			c.Close()
		}
	}()
	publicPort := public.Addr().(*net.TCPAddr).Port
	if err := tenantnet.AllowHostPorts(context.Background(), cfg, publicPort); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tenantnet.DisallowHostPorts(context.Background(), cfg, publicPort) })
	gateway := netip.MustParsePrefix(cfg.BuildsSubnet).Masked().Addr().Next()

	dir := t.TempDir()
	// The nonce keeps the step out of the cache: it must run in this test.
	dockerfile := fmt.Sprintf(`FROM busybox
RUN echo nonce %d; \
    t() { echo "probe $1: $(nc -w 2 $2 $3 </dev/null 2>&1 | head -c 200 | tr '\n' ' ')"; }; \
    t host-loopback 127.0.0.1 %d; \
    t host-address %s %d; \
    t host-gateway %s %d; \
    t host-public %s %d; \
    t app %s %d; \
    t outside %s %d; \
    echo "probe dns: $(nslookup %s %s 2>&1 | tr '\n' ' ')"; \
    echo "probe addr: $(ip -4 -o addr show 2>&1 | tr '\n' ' ')"
`, time.Now().UnixNano(), loPort, hostIP, anyPort, gateway, anyPort, hostIP, publicPort, app.Addr(), app.Port(), out.Addr, out.TCPPort, out.Name, out.Addr)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, log, err := bk.BuildImage(ctx, dir, dir, fmt.Sprintf("docker.io/library/tenantnet-probe:%d", time.Now().UnixNano()))
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
	for _, k := range []string{"host-loopback", "host-address", "host-gateway", "app"} {
		if _, ok := lines[k]; !ok {
			t.Fatalf("no %s line in the build log:\n%s", k, log)
		}
		if strings.Contains(lines[k], "secret") {
			t.Errorf("the build step reached %s: %q", k, lines[k])
		}
	}
	if lines["host-public"] != "public" {
		t.Errorf("the build step did not reach the host's allowed port %d: %q", publicPort, lines["host-public"])
	}
	if lines["outside"] != testenv.Greeting {
		t.Errorf("the build step did not reach the outside: %q", lines["outside"])
	}
	if !strings.Contains(lines["dns"], out.Addr.String()) {
		t.Errorf("the build step did not resolve %s: %q", out.Name, lines["dns"])
	}
	subnet := netip.MustParsePrefix(cfg.BuildsSubnet)
	onSubnet := false
	for _, m := range regexp.MustCompile(`inet ([0-9.]+)/`).FindAllStringSubmatch(lines["addr"], -1) {
		if a, err := netip.ParseAddr(m[1]); err == nil && subnet.Contains(a) {
			onSubnet = true
		}
	}
	if !onSubnet {
		t.Errorf("the build step is not on the builds' subnet %s: %q", subnet, lines["addr"])
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range hostPeers {
		if ap, err := netip.ParseAddrPort(p); err == nil && subnet.Contains(ap.Addr().Unmap()) {
			t.Errorf("a host listener accepted the build step from %s", p)
		}
	}
}

func hostAddress(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	cfg := tenantnet.DefaultConfig()
	skip := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix(cfg.AppsSubnet), netip.MustParsePrefix(cfg.BuildsSubnet)}
next:
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() {
			continue
		}
		for _, s := range skip {
			if s.Contains(p.Addr()) {
				continue next
			}
		}
		return p.Addr()
	}
	t.Fatal("this host has no non-loopback IPv4 address")
	return netip.Addr{}
}

// TestReleaseStale: an attachment whose namespace is gone (its holder was
// killed before CNI DEL) is released: its address allocation and cached result
// go; a live one stays.
func TestReleaseStale(t *testing.T) {
	n, err := tenantnet.NewAppsNetwork(tenantnet.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	attach := func(name string) (string, string, netip.Addr) {
		id := fmt.Sprintf("tenantnet-stale-%s-%d", name, time.Now().UnixNano())
		path := filepath.Join(dir, name)
		if err := tenantnet.NewNetNS(path); err != nil {
			t.Fatal(err)
		}
		addr, err := n.Attach(ctx, id, path)
		if err != nil {
			t.Fatal(err)
		}
		return id, path, addr
	}
	staleID, stalePath, staleAddr := attach("stale")
	liveID, livePath, liveAddr := attach("live")
	t.Cleanup(func() { _ = n.Detach(ctx, liveID, livePath); _ = tenantnet.RemoveNetNS(livePath) })
	if err := tenantnet.RemoveNetNS(stalePath); err != nil { // killed: no DEL
		t.Fatal(err)
	}
	if err := tenantnet.ReleaseStale(ctx, tenantnet.Config{}); err != nil {
		t.Fatal(err)
	}
	alloc := func(a netip.Addr) string {
		data, _ := os.ReadFile(filepath.Join("/var/lib/cni/networks", tenantnet.AppsNetwork, a.String()))
		return string(data)
	}
	if strings.Contains(alloc(staleAddr), staleID) {
		t.Errorf("%s is still allocated to %s", staleAddr, staleID)
	}
	if !strings.Contains(alloc(liveAddr), liveID) {
		t.Errorf("the live attachment lost its address %s", liveAddr)
	}
	if _, err := os.Stat(filepath.Join("/var/lib/cni/results", tenantnet.AppsNetwork+"-"+staleID+"-eth0")); !os.IsNotExist(err) {
		t.Errorf("cached result of %s: %v", staleID, err)
	}
}
