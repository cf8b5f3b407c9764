package local

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/testenv"
)

// networkProbe runs inside a probe instance and writes one line per target to
// /www/report.txt, then serves it. nc and wget time out on a dropped SYN, so a
// target that is filtered shows an empty result after a few seconds.
const networkProbe = `r=/www/report.txt; : > $r
t() { echo "$1: $(nc -w 2 $2 $3 </dev/null 2>&1 | head -c 200 | tr '\n' ' ')" >> $r; }
t host-loopback 127.0.0.1 $HOST_LO_PORT
t host-address $HOST_IP $HOST_ANY_PORT
t host-gateway $GATEWAY $HOST_ANY_PORT
t outside $OUTSIDE_IP $OUTSIDE_PORT
echo "other-app: $(wget -T 3 -O- http://$OTHER_APP/ 2>&1 | tr '\n' ' ')" >> $r
echo "dns: $(nslookup $OUTSIDE_NAME $OUTSIDE_IP 2>&1 | tr '\n' ' ')" >> $r
echo "resolv.conf: $(tr '\n' ' ' < /etc/resolv.conf)" >> $r
echo "hosts: $(grep localhost /etc/hosts | tr '\n' ' ')" >> $r
echo "addr: $(ip -4 -o addr show 2>&1 | tr '\n' ' ')" >> $r
cat $r
exec httpd -f -p $PORT -h /www
`

// hostListener accepts connections on addr, writes a secret and records who came.
type hostListener struct {
	l     net.Listener
	mu    sync.Mutex
	peers []string
}

const hostSecret = "host-secret"

func listenOnHost(t *testing.T, addr string) *hostListener {
	t.Helper()
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostListener{l: l}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.peers = append(h.peers, c.RemoteAddr().String())
			h.mu.Unlock()
			_, _ = c.Write([]byte(hostSecret + "\n"))
			c.Close()
		}
	}()
	return h
}

func (h *hostListener) port() int { return h.l.Addr().(*net.TCPAddr).Port }

// fromTenants lists the accepted connections that came from a tenant subnet.
func (h *hostListener) fromTenants(cfg tenantnet.Config) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, p := range h.peers {
		ap, err := netip.ParseAddrPort(p)
		if err != nil {
			continue
		}
		for _, s := range []string{cfg.AppsSubnet, cfg.BuildsSubnet} {
			if netip.MustParsePrefix(s).Contains(ap.Addr().Unmap()) {
				out = append(out, p)
			}
		}
	}
	return out
}

// hostAddress is an IPv4 address of this host that is not loopback and not on a
// network made by the tests: where etcd or the API server would listen if they
// listened on the host's address.
func hostAddress(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	outside := netip.MustParsePrefix("198.18.0.0/15")
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || outside.Contains(p.Addr()) {
			continue
		}
		cfg := tenantnet.DefaultConfig()
		if netip.MustParsePrefix(cfg.AppsSubnet).Contains(p.Addr()) || netip.MustParsePrefix(cfg.BuildsSubnet).Contains(p.Addr()) {
			continue
		}
		return p.Addr()
	}
	t.Fatal("this host has no non-loopback IPv4 address")
	return netip.Addr{}
}

// TestInstanceIsolation runs a probe instance next to another app's instance and
// reads its report: from inside its own network namespace it reaches neither the
// host's listeners (on 127.0.0.1, the host's address, the gateway) nor the other
// instance, but it reaches a server outside and resolves a name; the host (the
// test, as the edge would) reaches both instances at the addresses of their
// EndpointSlices. After Delete no namespace, veth, route or address is left.
func TestInstanceIsolation(t *testing.T) {
	f := newFixture(t, "isolation")
	out := testenv.StartOutside(t)
	lo := listenOnHost(t, "127.0.0.1:0")
	any := listenOnHost(t, "0.0.0.0:0")
	hostIP := hostAddress(t)
	tn := f.cfg.withDefaults().TenantNet
	gateway := netip.MustParsePrefix(tn.AppsSubnet).Masked().Addr().Next()

	_, otherURL := f.deployV1()
	other := strings.TrimPrefix(otherURL, "http://")

	ctx := context.Background()
	probeApp := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: f.app.Namespace}}
	if err := f.k8s.Create(ctx, probeApp); err != nil {
		t.Fatal(err)
	}
	probeKey := types.NamespacedName{Namespace: probeApp.Namespace, Name: probeApp.Name}
	t.Cleanup(func() { _ = f.rt.Delete(context.Background(), probeKey) })
	d := runtime.Desired{App: probeApp, Release: 1, Image: f.v1,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", `eval "$$PROBE"`}}},
		Env: []appv1.EnvVar{
			{Name: "PROBE", Value: networkProbe},
			{Name: "HOST_LO_PORT", Value: fmt.Sprint(lo.port())},
			{Name: "HOST_ANY_PORT", Value: fmt.Sprint(any.port())},
			{Name: "HOST_IP", Value: hostIP.String()},
			{Name: "GATEWAY", Value: gateway.String()},
			{Name: "OUTSIDE_IP", Value: out.Addr.String()},
			{Name: "OUTSIDE_PORT", Value: fmt.Sprint(out.TCPPort)},
			{Name: "OUTSIDE_NAME", Value: out.Name},
			{Name: "OTHER_APP", Value: other},
		}}
	testenv.Eventually(t, time.Minute, "probe app rolled out", func() error {
		st, err := f.rt.Sync(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Failure != "" {
			t.Fatalf("probe app: %+v", st)
		}
		if !st.RolledOut {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	urls, err := readEndpoints(f.k8s, probeKey)
	if err != nil || len(urls) != 1 {
		t.Fatalf("probe endpoints %v, %v", urls, err)
	}
	report, err := get(urls[0] + "/report.txt")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe report (served from %s):\n%s", urls[0], report)
	lines := map[string]string{}
	for _, l := range strings.Split(report, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			lines[k] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"host-loopback", "host-address", "host-gateway"} {
		if strings.Contains(lines[k], hostSecret) {
			t.Errorf("the probe reached the host's listener (%s): %q", k, lines[k])
		}
	}
	if strings.Contains(lines["other-app"], "version v1") {
		t.Errorf("the probe reached the other app's instance at %s: %q", other, lines["other-app"])
	}
	// The host (the edge) reaches it all the same.
	f.mustGet(otherURL, "version v1")
	if lines["outside"] != testenv.Greeting {
		t.Errorf("the probe did not reach the outside server: %q", lines["outside"])
	}
	if !strings.Contains(lines["dns"], out.Addr.String()) || !strings.Contains(lines["dns"], out.Name) {
		t.Errorf("the probe did not resolve %s: %q", out.Name, lines["dns"])
	}
	if strings.Contains(lines["resolv.conf"], "127.0.0.") || !strings.Contains(lines["resolv.conf"], "nameserver") {
		t.Errorf("resolv.conf in the namespace: %q", lines["resolv.conf"])
	}
	if !strings.Contains(lines["hosts"], "127.0.0.1") {
		t.Errorf("hosts in the namespace: %q", lines["hosts"])
	}
	probeAddr := strings.TrimPrefix(strings.Split(urls[0], ":")[1], "//")
	if !strings.Contains(lines["addr"], probeAddr+"/") {
		t.Errorf("the probe's own address %s is not in its namespace: %q", probeAddr, lines["addr"])
	}
	// The listeners saw no connection from a tenant: what the probe did not reach
	// was dropped before it, not refused by it.
	if p := append(lo.fromTenants(tn), any.fromTenants(tn)...); len(p) > 0 {
		t.Errorf("host listeners accepted tenants: %v", p)
	}
	// The outside saw the host's address (masqueraded), not the tenant's.
	for _, p := range out.Peers() {
		if strings.HasPrefix(p, probeAddr+":") {
			t.Errorf("the outside server saw the tenant's own address %s (not masqueraded)", p)
		}
	}

	// Both instances go; nothing of their networks is left.
	ids := map[string]netip.Addr{}
	for _, key := range []types.NamespacedName{f.key(), probeKey} {
		for _, inst := range f.instancesOf(key) {
			ids[inst.netns] = inst.addr
		}
		if err := f.rt.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if len(ids) != 2 {
		t.Fatalf("instances: %v", ids)
	}
	f.assertNoNetworkLeft(ids)
}

// instancesOf returns the runtime's instances of key.
func (f *fixture) instancesOf(key types.NamespacedName) []*instance {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	var out []*instance
	if a := f.rt.apps[key]; a != nil {
		for _, inst := range a.instances {
			out = append(out, inst)
		}
	}
	return out
}

// assertNoNetworkLeft checks that the namespaces (id → address) left no mount or
// directory, no CNI result or address allocation, no veth (its /32 route on the
// host goes with it) and no iptables rule naming them.
func (f *fixture) assertNoNetworkLeft(ids map[string]netip.Addr) {
	f.t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		f.t.Fatal(err)
	}
	netDir := filepath.Join(f.cfg.StateDir, "net")
	for id := range ids {
		if id == "" {
			f.t.Fatal("an instance without a network namespace")
		}
		if strings.Contains(string(mounts), filepath.Join(netDir, id)) {
			f.t.Errorf("network namespace %s is still mounted", id)
		}
		if _, err := os.Stat(filepath.Join(netDir, id)); !os.IsNotExist(err) {
			f.t.Errorf("network directory of %s left in %s (%v)", id, netDir, err)
		}
	}
	rules, err := exec.Command("iptables-save").CombinedOutput()
	if err != nil {
		f.t.Fatal(err)
	}
	for id, addr := range ids {
		if _, err := os.Stat(filepath.Join("/var/lib/cni/networks", tenantnet.AppsNetwork, addr.String())); err == nil {
			if owner, _ := os.ReadFile(filepath.Join("/var/lib/cni/networks", tenantnet.AppsNetwork, addr.String())); strings.Contains(string(owner), id) {
				f.t.Errorf("address %s is still allocated to %s", addr, id)
			}
		}
		results, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*"+id+"*"))
		if len(results) > 0 {
			f.t.Errorf("CNI results of %s left: %v", id, results)
		}
		if out, _ := exec.Command("ip", "route", "show", addr.String()+"/32").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
			f.t.Errorf("route to %s left (its veth): %s", addr, out)
		}
		if strings.Contains(string(rules), addr.String()) {
			f.t.Errorf("an iptables rule names %s", addr)
		}
	}
}

// TestLeftoverNetworksAreCleanedAtStart: a namespace whose container is gone (a
// crash between the namespace's setup and the container's creation) is torn down
// when the runtime starts again; Close tears the pool down.
func TestLeftoverNetworksAreCleanedAtStart(t *testing.T) {
	f := newFixture(t, "leftover")
	ctx := context.Background()
	att, err := f.rt.net.setup(ctx, "leftover-shop-web-r1-1-abcdef") // and no container
	if err != nil {
		t.Fatal(err)
	}
	if !tenantnet.IsNetNS(att.netns()) {
		t.Fatalf("%s is not a network namespace", att.netns())
	}
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}
	f.rt = f.newRuntime()
	f.assertNoNetworkLeft(map[string]netip.Addr{att.id: att.addr})
	// The pool of the first runtime went with its Close; the second's goes with
	// its own.
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(f.cfg.StateDir, "net"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("namespaces left after Close: %v", entries)
	}
	f.rt = f.newRuntime()
}

// TestAdoptionAfterTheNamespacesWereReleased is a reboot: the containers are
// there, their tasks and namespaces are gone (bex up, when it stops, releases the
// namespaces as DetachAll does here, and deletes the containers too); the next
// runtime gives each adopted container a namespace again at the path its spec
// names, and it serves at its new address.
func TestAdoptionAfterTheNamespacesWereReleased(t *testing.T) {
	f := newFixture(t, "released")
	f.deployV1()
	before := f.instancesOf(f.key())
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}
	// The tasks die, the containers stay (a reboot; bex up deletes them too).
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, inst := range before {
		ctr, err := cl.LoadContainer(context.Background(), inst.id)
		if err != nil {
			t.Fatal(err)
		}
		if task, err := ctr.Task(context.Background(), nil); err == nil {
			if _, err := task.Delete(context.Background(), containerd.WithProcessKill); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := tenantnet.NewAppsNetwork(f.cfg.TenantNet)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.DetachAll(context.Background(), filepath.Join(f.cfg.StateDir, "net")); err != nil {
		t.Fatal(err)
	}
	f.rt = f.newRuntime()
	f.syncUntil(f.desired(1, f.v1, 1), time.Minute, "rolled out after the restart", rolledOut)
	after := f.instancesOf(f.key())
	if len(after) != 1 || len(before) != 1 || after[0].id != before[0].id {
		t.Fatalf("instances before %v, after %v: want the same container adopted", before, after)
	}
	if !tenantnet.IsNetNS(filepath.Join(f.cfg.StateDir, "net", after[0].netns, "netns")) {
		t.Fatal("the adopted container has no network namespace")
	}
	eps := f.endpoints()
	want := fmt.Sprintf("http://%s:%d", after[0].addr, after[0].port)
	if len(eps) != 1 || eps[0] != want {
		t.Fatalf("endpoints %v, want [%s]", eps, want)
	}
	f.mustGet(want, "version v1")
}

// TestInstanceEgress: the runtime installs the tenants' rules when it starts,
// with its Config.TenantNet's allowed ranges (the deployer's
// --allow-tenant-egress); a probe instance reaches the one LAN address allowed,
// not the others (a private and a link-local one), nor the host's listener. The
// runtime's chains and subnets are the test's own, so that another installer of
// the default rules on this machine cannot change them meanwhile.
func TestInstanceEgress(t *testing.T) {
	f := newFixture(t, "egress")
	lan := testenv.StartLAN(t, netip.MustParseAddr("10.212.9.9"), netip.MustParseAddr("169.254.79.9"), netip.MustParseAddr("192.168.212.9"))
	allowed := lan.Addrs[2]
	any := listenOnHost(t, "0.0.0.0:0")
	f.rt.Close()
	f.cfg.TenantNet = tenantnet.Config{ChainPrefix: "BEXEGRESSRT", AppsSubnet: "10.237.0.0/16", BuildsSubnet: "10.238.0.0/16",
		AllowEgress: []netip.Prefix{netip.PrefixFrom(allowed, 32)}}
	t.Cleanup(func() { _ = tenantnet.Remove(context.Background(), f.cfg.TenantNet) })
	f.rt = f.newRuntime()

	ctx := context.Background()
	probe := `r=/www/report.txt; : > $r
t() { echo "$1: $(nc -w 2 $2 $3 </dev/null 2>&1 | head -c 200 | tr '\n' ' ')" >> $r; }
t private $LAN_PRIVATE $LAN_PORT
t link-local $LAN_LINK_LOCAL $LAN_PORT
t allowed $LAN_ALLOWED $LAN_PORT
t host-address $HOST_IP $HOST_ANY_PORT
echo "addr: $(ip -4 -o addr show 2>&1 | tr '\n' ' ')" >> $r
exec httpd -f -p $PORT -h /www
`
	d := runtime.Desired{App: f.app, Release: 1, Image: f.v1,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", `eval "$$PROBE"`}}},
		Env: []appv1.EnvVar{
			{Name: "PROBE", Value: probe},
			{Name: "LAN_PRIVATE", Value: lan.Addrs[0].String()},
			{Name: "LAN_LINK_LOCAL", Value: lan.Addrs[1].String()},
			{Name: "LAN_ALLOWED", Value: allowed.String()},
			{Name: "LAN_PORT", Value: fmt.Sprint(lan.TCPPort)},
			{Name: "HOST_IP", Value: hostAddress(t).String()},
			{Name: "HOST_ANY_PORT", Value: fmt.Sprint(any.port())},
		}}
	testenv.Eventually(t, time.Minute, "probe app rolled out", func() error {
		st, err := f.rt.Sync(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Failure != "" {
			t.Fatalf("probe app: %+v", st)
		}
		if !st.RolledOut {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	urls, err := readEndpoints(f.k8s, f.key())
	if err != nil || len(urls) != 1 {
		t.Fatalf("probe endpoints %v, %v", urls, err)
	}
	report, err := get(urls[0] + "/report.txt")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe report (served from %s):\n%s", urls[0], report)
	lines := map[string]string{}
	for _, l := range strings.Split(report, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			lines[k] = strings.TrimSpace(v)
		}
	}
	if !strings.Contains(lines["addr"], "inet 10.237.") {
		t.Fatalf("the probe is not on the runtime's subnet 10.237.0.0/16: %q", lines["addr"])
	}
	if lines["allowed"] != "lan "+allowed.String() {
		t.Errorf("the probe did not reach the allowed %s: %q", allowed, lines["allowed"])
	}
	for _, k := range []string{"private", "link-local", "host-address"} {
		if v, ok := lines[k]; !ok || strings.Contains(v, "lan ") || strings.Contains(v, hostSecret) {
			t.Errorf("the probe reached %s: %q", k, v)
		}
	}
	if p := lan.Peers(); len(p) != 1 {
		t.Errorf("the LAN accepted %v, want one connection (to %s)", p, allowed)
	}
}
