package tenantnet_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/machine/tenantnet"
)

// linksConfig has chains and subnets of its own, as egressConfig does.
func linksConfig(t testing.TB) tenantnet.Config {
	cfg := tenantnet.DefaultConfig()
	cfg.ChainPrefix, cfg.AppsSubnet, cfg.BuildsSubnet = "BEXLINKT", "10.241.0.0/16", "10.242.0.0/16"
	cfg.ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(cfg.ResolvConf, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestLinkRules(t *testing.T) {
	cfg := linksConfig(t)
	if g := cfg.AppsGateway(); g != netip.MustParseAddr("10.241.0.1") {
		t.Errorf("AppsGateway = %s", g)
	}
	if g := (tenantnet.Config{}).AppsGateway(); g != netip.MustParseAddr("10.89.0.1") {
		t.Errorf("the default AppsGateway = %s", g)
	}
	db := netip.MustParseAddrPort("10.241.3.4:5432")
	r, err := cfg.DatabaseRule("shop/db.db", 25003, db)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.String(), "-t nat -A BEXLINKT-DATABASES -s 10.241.0.0/16 -d 10.241.0.1/32 -p tcp --dport 25003 -m comment --comment shop/db.db -j DNAT --to-destination 10.241.3.4:5432"; got != want {
		t.Errorf("DatabaseRule:\n got %s\nwant %s", got, want)
	}
	app := netip.MustParseAddr("10.241.0.9")
	rules, err := cfg.LinkRules("0a1b2c", app, []uint16{25003, 25001, 25003})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.String())
	}
	want := []string{
		"-t filter -A BEXLINKT-LINKS -m conntrack --ctorigsrc 10.241.0.9 --ctorigdst 10.241.0.1 --ctorigdstport 25003 -m comment --comment 0a1b2c -j ACCEPT",
		"-t filter -A BEXLINKT-LINKS -m conntrack --ctorigsrc 10.241.0.9 --ctorigdst 10.241.0.1 --ctorigdstport 25001 -m comment --comment 0a1b2c -j ACCEPT",
	}
	if !slices.Equal(got, want) {
		t.Errorf("LinkRules:\n got %q\nwant %q", got, want)
	}
	if rules, err := cfg.LinkRules("0a1b2c", app, nil); err != nil || len(rules) != 0 {
		t.Errorf("LinkRules without ports = %v, %v", rules, err)
	}

	// The jump to the links comes before the tenant-to-tenant drop.
	var lines []string
	for _, r := range cfg.Rules(tenantnet.Resolvers{}) {
		lines = append(lines, r.String())
	}
	jump := slices.Index(lines, "-t filter -A BEXLINKT-FORWARD -s 10.241.0.0/16 -d 10.241.0.0/16 -j BEXLINKT-LINKS")
	drop := slices.Index(lines, "-t filter -A BEXLINKT-FORWARD -s 10.241.0.0/16 -d 10.241.0.0/16 -j DROP")
	first := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, " -A BEXLINKT-FORWARD ") })
	if jump < 0 || drop < 0 || jump > drop || jump != first {
		t.Errorf("the jump to the links (%d) is not the first of FORWARD, before the drop (%d):\n%s", jump, drop, strings.Join(lines, "\n"))
	}

	long := strings.Repeat("a", 201)
	for _, bad := range []string{"", long, "Shop", "shop db", "shop\"db", "shop;db", "shop\ndb"} {
		if _, err := cfg.DatabaseRule(bad, 25000, db); err == nil || !strings.Contains(err.Error(), "want 1 to 200") {
			t.Errorf("DatabaseRule(%q) = %v", bad, err)
		}
		if _, err := cfg.LinkRules(bad, app, []uint16{25000}); err == nil || !strings.Contains(err.Error(), "want 1 to 200") {
			t.Errorf("LinkRules(%q) = %v", bad, err)
		}
	}
	if _, err := cfg.DatabaseRule(strings.Repeat("a", 200), 25000, db); err != nil {
		t.Errorf("a name of 200 characters: %v", err)
	}
	for _, target := range []string{"10.242.0.5:5432", "192.0.2.1:5432", "10.241.0.1:5432", "10.241.0.0:5432", "[fd00::1]:5432"} {
		if _, err := cfg.DatabaseRule("shop", 25000, netip.MustParseAddrPort(target)); err == nil || !strings.Contains(err.Error(), "want an app instance's address in 10.241.0.0/16") {
			t.Errorf("DatabaseRule to %s = %v", target, err)
		}
	}
	if _, err := cfg.DatabaseRule("shop", 25000, netip.AddrPort{}); err == nil {
		t.Error("DatabaseRule to no target: no error")
	}
	if _, err := cfg.DatabaseRule("shop", 0, db); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("DatabaseRule on port 0 = %v", err)
	}
	if _, err := cfg.DatabaseRule("shop", 25000, netip.AddrPortFrom(db.Addr(), 0)); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("DatabaseRule to port 0 = %v", err)
	}
	for _, src := range []string{"10.242.0.5", "192.0.2.1", "10.241.0.1", "10.241.0.0", "fd00::1"} {
		if _, err := cfg.LinkRules("0a1b2c", netip.MustParseAddr(src), []uint16{25000}); err == nil || !strings.Contains(err.Error(), "want an app instance's address") {
			t.Errorf("LinkRules from %s = %v", src, err)
		}
	}
	if _, err := cfg.LinkRules("0a1b2c", app, []uint16{25000, 0}); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("LinkRules with port 0 = %v", err)
	}
	bad := cfg
	bad.ChainPrefix = "bex"
	if _, err := bad.LinkRules("0a1b2c", app, []uint16{25000}); err == nil || !strings.Contains(err.Error(), "Config.ChainPrefix") {
		t.Errorf("LinkRules with a bad ChainPrefix = %v", err)
	}
	// What is refused never reaches iptables: these fail before any chain is
	// looked at (none of this prefix exists).
	ctx := context.Background()
	if err := cfg.Expose(ctx, "shop db", 25000, db); err == nil || !strings.Contains(err.Error(), "want 1 to 200") {
		t.Errorf("Expose with a bad name = %v", err)
	}
	if err := cfg.AllowLinks(ctx, "0a1b2c", netip.MustParseAddr("10.242.0.5"), []uint16{25000}); err == nil || !strings.Contains(err.Error(), "want an app instance's address") {
		t.Errorf("AllowLinks from the builds' subnet = %v", err)
	}
	for _, err := range []error{cfg.Unexpose(ctx, "a b"), cfg.RemoveLinks(ctx, "")} {
		if err == nil || !strings.Contains(err.Error(), "want 1 to 200") {
			t.Errorf("Unexpose/RemoveLinks with a bad name = %v", err)
		}
	}
}

// dbServer is the database instance's listener: it answers a line with "db
// got <line>" and records the peers' addresses.
type dbServer struct {
	mu    sync.Mutex
	peers []netip.Addr
}

func (s *dbServer) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.peers = append(s.peers, netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap())
		s.mu.Unlock()
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil {
				_, _ = fmt.Fprintf(c, "db got %s", line)
			}
		}()
	}
}

func (s *dbServer) seen() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.peers)
}

// exchange connects from the namespace at ns to ap, writes a line and returns
// the line it reads back, or the error. A connection that no rule accepts is dropped, and
// fails by timeout: local peers answer in well under the timeout.
func exchange(ns string, ap netip.AddrPort, timeout time.Duration) string {
	var got string
	err := tenantnet.InNetNS(ns, func() error {
		c, err := net.DialTimeout("tcp4", ap.String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		got = strings.TrimSpace(line)
		return err
	})
	if err != nil {
		return err.Error()
	}
	return got
}

// Timeouts of the probes: what must connect, and what must not (a drop: the
// dial times out; a reachable peer on a veth answers in well under a
// millisecond).
const (
	reach   = 3 * time.Second
	noReach = 400 * time.Millisecond
)

// TestLinks: a database instance exposed at a port of the apps' gateway is
// reached there by the linked app instance, with its own address, and by no
// one else: not by an app that is not linked, not by a build step, not at its
// own address even by the linked app; the host's listener on that port is not
// what an app reaches while the database is exposed, and is once it is not.
// SweepLinks, RemoveLinks, a second Install and Remove do what they say.
func TestLinks(t *testing.T) {
	start := time.Now()
	cfg := linksConfig(t)
	ctx := context.Background()
	install(t, cfg)
	appNS, appAddr := tenant(t, cfg)
	strangerNS, strangerAddr := tenant(t, cfg)
	dbNS, dbAddr := tenant(t, cfg)
	// A build step's namespace: the same plugin on the builds' subnet, under
	// the same rules.
	buildsNet := cfg
	buildsNet.AppsSubnet, buildsNet.BuildsSubnet = cfg.BuildsSubnet, "10.243.0.0/16"
	buildNS, _ := tenant(t, buildsNet)
	gateway := cfg.AppsGateway()

	db := &dbServer{}
	var dbL net.Listener
	if err := tenantnet.InNetNS(dbNS, func() error {
		var err error
		dbL, err = net.Listen("tcp4", netip.AddrPortFrom(dbAddr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dbL.Close() })
	go db.serve(dbL)
	target := netip.MustParseAddrPort(dbL.Addr().String())

	// The host listens on the database's port, on every address, and tenants
	// may reach that port of the host (as the edge's): without the DNAT, an app
	// that connects to the gateway's port reaches the host.
	hostL, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostL.Close() })
	go func() {
		for {
			c, err := hostL.Accept()
			if err != nil {
				return
			}
			// The line first: closed with it unread, the connection would be
			// reset, which could overtake the answer.
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
				_, _ = c.Write([]byte("host\n"))
			}
			c.Close()
		}
	}()
	port := uint16(hostL.Addr().(*net.TCPAddr).Port)
	if err := tenantnet.AllowHostPorts(ctx, cfg, int(port)); err != nil {
		t.Fatal(err)
	}
	exposed := netip.AddrPortFrom(gateway, port)

	const name, appOwner, staleOwner = "links-test/shop.db", "0a1b2c3d", "dead0001"
	if err := cfg.Expose(ctx, name, port, target); err != nil {
		t.Fatal(err)
	}
	if err := cfg.AllowLinks(ctx, appOwner, appAddr, []uint16{port, 25999}); err != nil {
		t.Fatal(err)
	}

	// probes runs the probes at once (the refused ones each wait out their
	// timeout) and returns what each got.
	type probe struct {
		name, ns string
		to       netip.AddrPort
		timeout  time.Duration
	}
	probes := func(ps ...probe) map[string]string {
		got := map[string]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Go(func() {
				v := exchange(p.ns, p.to, p.timeout)
				mu.Lock()
				got[p.name] = v
				mu.Unlock()
			})
		}
		wg.Wait()
		t.Logf("probes: %q", got)
		return got
	}
	linked := probe{"linked app", appNS, exposed, reach}
	stranger := probe{"stranger", strangerNS, exposed, noReach}
	refused := func(got map[string]string, who string) {
		t.Helper()
		if v := got[who]; !strings.Contains(v, "timeout") {
			t.Errorf("%s: %q, want the connection dropped (a timeout)", who, v)
		}
	}
	reached := func(got map[string]string, who, want string) {
		t.Helper()
		if got[who] != want {
			t.Errorf("%s: %q, want %q", who, got[who], want)
		}
	}

	got := probes(linked, stranger,
		probe{"linked app, the database's own address", appNS, target, noReach},
		probe{"build step", buildNS, exposed, reach},
		probe{"build step, the database's own address", buildNS, target, noReach},
	)
	reached(got, "linked app", "db got ping")
	refused(got, "stranger")
	refused(got, "linked app, the database's own address")
	// The build step reaches the host's allowed port, as it would any host's
	// address: the DNAT is the apps' alone.
	reached(got, "build step", "host")
	refused(got, "build step, the database's own address")
	// The database sees the app's own address (no masquerade inside the
	// subnet), and no one else's.
	if peers := db.seen(); !slices.Equal(peers, []netip.Addr{appAddr}) {
		t.Errorf("the database accepted %v, want %s once", peers, appAddr)
	}

	countRules := func(table, chain string) int {
		t.Helper()
		out, err := exec.Command("iptables", "-w", "5", "-t", table, "-S", chain).CombinedOutput()
		if err != nil {
			t.Fatalf("iptables -S %s: %v: %s", chain, err, out)
		}
		return strings.Count(string(out), "-A "+chain+" ")
	}
	links := func() int { return countRules("filter", "BEXLINKT-LINKS") }
	databases := func() int { return countRules("nat", "BEXLINKT-DATABASES") }

	// Idempotent: the same again adds nothing; fewer ports take the others away.
	if err := cfg.Expose(ctx, name, port, target); err != nil {
		t.Fatal(err)
	}
	if err := cfg.AllowLinks(ctx, appOwner, appAddr, []uint16{25999, port}); err != nil {
		t.Fatal(err)
	}
	if n, m := databases(), links(); n != 1 || m != 2 {
		t.Fatalf("after the same Expose and AllowLinks again: %d database rules, %d links; want 1 and 2", n, m)
	}
	if err := cfg.AllowLinks(ctx, appOwner, appAddr, []uint16{port}); err != nil {
		t.Fatal(err)
	}
	if n := links(); n != 1 {
		t.Fatalf("after AllowLinks of one port: %d links, want 1", n)
	}
	// A port that another name holds is refused, naming it; nothing changes.
	if err := cfg.Expose(ctx, "links-test/other.db", port, target); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("Expose on a port that %s holds: %v", name, err)
	}
	if n := databases(); n != 1 {
		t.Fatalf("after a refused Expose: %d database rules, want 1", n)
	}

	// A namespace that is gone left its links (staleOwner, here the stranger's
	// address): the stranger gets in, until SweepLinks, which keeps the live one.
	if err := cfg.AllowLinks(ctx, staleOwner, strangerAddr, []uint16{port}); err != nil {
		t.Fatal(err)
	}
	got = probes(probe{"stranger", strangerNS, exposed, reach})
	reached(got, "stranger", "db got ping")
	var asked []string
	if err := cfg.SweepLinks(ctx, func(owner string) bool { asked = append(asked, owner); return owner == appOwner }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	if !slices.Equal(asked, []string{appOwner, staleOwner}) {
		t.Errorf("SweepLinks asked about %q", asked)
	}
	got = probes(linked, stranger)
	reached(got, "linked app", "db got ping")
	refused(got, "stranger")

	// A second Install rewrites bex's chains and keeps the databases and links.
	if err := tenantnet.Install(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if n, m := databases(), links(); n != 1 || m != 1 {
		t.Fatalf("after a second Install: %d database rules, %d links; want 1 and 1", n, m)
	}
	got = probes(linked)
	reached(got, "linked app", "db got ping")

	// Unlinked, the app is refused too.
	if err := cfg.RemoveLinks(ctx, appOwner); err != nil {
		t.Fatal(err)
	}
	if err := cfg.RemoveLinks(ctx, appOwner); err != nil {
		t.Fatalf("a second RemoveLinks: %v", err)
	}
	got = probes(probe{"linked app", appNS, exposed, noReach})
	refused(got, "linked app")

	// Unexposed, the gateway's port is the host's again: the control of the
	// host listener that the probes above did not reach.
	if err := cfg.Unexpose(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Unexpose(ctx, name); err != nil {
		t.Fatalf("a second Unexpose: %v", err)
	}
	got = probes(linked)
	reached(got, "linked app", "host")
	if n := len(db.seen()); n != 4 {
		t.Errorf("the database accepted %d connections, want 4 (the linked app's three, the stale owner's one): %v", n, db.seen())
	}

	// Remove takes the chains away, with what they hold.
	if err := cfg.Expose(ctx, name, port, target); err != nil {
		t.Fatal(err)
	}
	if err := cfg.AllowLinks(ctx, appOwner, appAddr, []uint16{port}); err != nil {
		t.Fatal(err)
	}
	if err := tenantnet.Remove(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("iptables-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v: %s", err, out)
	}
	if strings.Contains(string(out), "BEXLINKT") {
		t.Errorf("iptables still names BEXLINKT after Remove:\n%s", out)
	}
	if err := cfg.AllowLinks(ctx, appOwner, appAddr, []uint16{port}); err == nil || !strings.Contains(err.Error(), "has Install run?") {
		t.Errorf("AllowLinks without the chains: %v", err)
	}
	// A namespace torn down after Remove has no rule left to remove.
	if err := cfg.RemoveLinks(ctx, appOwner); err != nil {
		t.Errorf("RemoveLinks without the chains: %v", err)
	}
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// TestAttached: a namespace attached to the apps' network is, by its id, until
// it is detached or unmounted; an id never attached is not.
func TestAttached(t *testing.T) {
	cfg := linksConfig(t)
	n, err := tenantnet.NewAppsNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := fmt.Sprintf("tenantnet-attached-%d", time.Now().UnixNano())
	path := filepath.Join(t.TempDir(), "netns")
	if err := tenantnet.NewNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Detach(ctx, id, path); _ = tenantnet.RemoveNetNS(path) })
	if tenantnet.Attached(id) {
		t.Fatal("Attached before Attach")
	}
	if _, err := n.Attach(ctx, id, path); err != nil {
		t.Fatal(err)
	}
	if !tenantnet.Attached(id) {
		t.Fatal("not Attached after Attach")
	}
	if tenantnet.Attached(id + "-other") {
		t.Fatal("another id is Attached")
	}
	// A namespace unmounted without a detach (a crash) is not attached.
	if err := tenantnet.RemoveNetNS(path); err != nil {
		t.Fatal(err)
	}
	if tenantnet.Attached(id) {
		t.Fatal("Attached after the namespace went")
	}
	if err := n.Detach(ctx, id, path); err != nil {
		t.Fatal(err)
	}
	if tenantnet.Attached(id) {
		t.Fatal("Attached after Detach")
	}
}
