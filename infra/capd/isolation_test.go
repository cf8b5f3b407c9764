package capd

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/infra/testapps"
	"bex.co/bex/internal/testenv"
)

// TestTenantPodReachesOnlyTheCluster pushes the probe app (a tenant's app that
// reports what its pod reaches: infra/cluster/testdata/probe) and asks it, from
// inside its pod on a worker machine, to open TCP connections. A machine is a
// container on Docker's network: without bex-isolate (hack/capd/isolate) its pods
// reach the host through the network's gateway (every address the host listens
// on) and, the host forwarding, the host's LAN and a metadata address. Each such
// target is made here for the test (a listener of the host's on every address; a
// LAN namespace on this machine reached by /32 routes) and must refuse the probe
// and see no connection, while the cluster itself stays reachable: the API server
// by its node's address and by its Service, a pod on another machine. The
// machine's own processes (a host-network pod's view) are held to the same, and
// the load balancer's ports are published on the host's loopback only.
func TestTenantPodReachesOnlyTheCluster(t *testing.T) {
	gateway := strings.TrimSpace(docker(t, "network", "inspect", "kind", "-f", "{{(index .IPAM.Config 0).Gateway}}"))
	hostAddr := hostAddress(t)
	// The host listens on every address, as Cluster API's webhooks and CAPD's
	// port 19000 do.
	host, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostPeers := make(chan string, 16)
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			hostPeers <- c.RemoteAddr().String()
			c.Close()
		}
	}()
	hostPort := host.Addr().(*net.TCPAddr).Port
	lan := testenv.StartLAN(t, netip.MustParseAddr("10.212.9.9"), netip.MustParseAddr("169.254.169.254"))

	app := fmt.Sprintf("capd-probe-%d", time.Now().Unix()%100000)
	dir := t.TempDir()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := testapps.BuildProbe(root, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(testapps.ProbeDockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	pushDir(t, dir, app)
	t.Cleanup(func() { bex(t, "apps:destroy", app, "--confirm", app) })

	probeNode := strings.TrimSpace(kubectl(t, "get", "pods", "-A", "-l", "app.bex.co/app="+app,
		"-o", "jsonpath={.items[0].spec.nodeName}"))
	// A pod on another machine: CoreDNS, on the control plane's.
	var otherPod string
	for _, l := range strings.Split(strings.TrimSpace(kubectl(t, "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns",
		"-o", `jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP}{"\n"}{end}`)), "\n") {
		if node, ip, ok := strings.Cut(l, " "); ok && node != probeNode && ip != "" {
			otherPod = net.JoinHostPort(ip, "53")
		}
	}
	if otherPod == "" {
		t.Fatalf("no CoreDNS pod on a machine other than the probe's (%s): the control needs one", probeNode)
	}
	cpIP := strings.TrimSpace(kubectl(t, "get", "nodes", "-l", "node-role.kubernetes.io/control-plane",
		"-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	apiService := strings.TrimSpace(kubectl(t, "-n", "default", "get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"))

	port := func(a string, p int) string { return net.JoinHostPort(a, fmt.Sprint(p)) }
	refused := map[string]string{
		port(gateway, hostPort):              "the host, through the Docker network's gateway",
		port(hostAddr, hostPort):             "the host, at its own address",
		port("10.212.9.9", lan.TCPPort):      "the LAN (a namespace on this machine)",
		port("169.254.169.254", lan.TCPPort): "the metadata address (a namespace on this machine)",
		port(gateway, 19000):                 "CAPD's port on the host",
	}
	reached := map[string]string{
		net.JoinHostPort(cpIP, "6443"):      "the API server at the control plane machine's address",
		net.JoinHostPort(apiService, "443"): "the API server's Service",
		otherPod:                            "a pod on another machine",
	}
	var addrs []string
	for a := range refused {
		addrs = append(addrs, a)
	}
	for a := range reached {
		addrs = append(addrs, a)
	}
	var results []testapps.ProbeResult
	testenv.Eventually(t, time.Minute, "the probe answers /tcp", func() error {
		out, err := curl(app, "/tcp?"+url.Values{"addr": addrs}.Encode())
		if err != nil {
			return err
		}
		return json.Unmarshal([]byte(out), &results)
	})
	for _, r := range results {
		t.Logf("from a pod on %s: %s connected=%v err=%q", probeNode, r.Target, r.Connected, r.Err)
		if what, ok := refused[r.Target]; ok && r.Connected {
			t.Errorf("a tenant's pod connected to %s (%s)", r.Target, what)
		}
		if what, ok := reached[r.Target]; ok && !r.Connected {
			t.Errorf("a tenant's pod cannot reach %s (%s): %s", r.Target, what, r.Err)
		}
	}
	if len(results) != len(addrs) {
		t.Errorf("%d results for %d addresses", len(results), len(addrs))
	}

	// The machine itself (its processes, host-network pods such as the edge).
	for _, target := range []string{port(gateway, hostPort), port("10.212.9.9", lan.TCPPort)} {
		h, p, _ := net.SplitHostPort(target)
		out, err := exec.Command("docker", "exec", probeNode, "timeout", "5", "bash", "-c",
			fmt.Sprintf("exec 3<>/dev/tcp/%s/%s", h, p)).CombinedOutput()
		t.Logf("from the machine %s: %s: %v %s", probeNode, target, err, strings.TrimSpace(string(out)))
		if err == nil {
			t.Errorf("the machine %s connected to %s", probeNode, target)
		}
	}
	if len(hostPeers) != 0 || len(lan.Peers()) != 0 {
		t.Errorf("connections accepted from the cluster: %d by the host, by the LAN %v", len(hostPeers), lan.Peers())
	}

	// The load balancer's ports (the API server, haproxy's statistics): CAPD
	// publishes them on every address; hack/cluster-capd.sh's Docker proxies them
	// on loopback only.
	for _, l := range strings.Split(strings.TrimSpace(docker(t, "port", env["CLUSTER_NAME"]+"-lb")), "\n") {
		_, published, ok := strings.Cut(l, " -> ")
		if !ok {
			continue
		}
		_, p, _ := net.SplitHostPort(published)
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(hostAddr, p), 3*time.Second); err == nil {
			c.Close()
			t.Errorf("the load balancer's %s answers at the host's address %s", l, hostAddr)
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", p), 3*time.Second)
		if err != nil {
			t.Errorf("the load balancer's %s does not answer on loopback: %v", l, err)
			continue
		}
		c.Close()
	}
}

// hostAddress is the host's own address on its way out (the source of its
// default route: a lookup, nothing is sent): the address a LAN reaches it at.
func hostAddress(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("ip", "-4", "-o", "route", "get", "203.0.113.1").Output()
	if err != nil {
		t.Fatalf("ip route get: %v", err)
	}
	f := strings.Fields(string(out))
	for i := range f[:len(f)-1] {
		if f[i] == "src" {
			return f[i+1]
		}
	}
	t.Fatalf("no source address in %q", out)
	return ""
}
