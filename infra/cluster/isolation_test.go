package cluster

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"bex.co/bex/infra/testapps"
	"bex.co/bex/internal/testenv"
)

// probeResult is one attempt of the probe app (testdata/probe).
type probeResult = testapps.ProbeResult

// TestTenantPodIsolation pushes a probe app through bex (a Go program on busybox,
// testdata/probe) and asks it, from inside its pod in the apps' namespace, what
// it can reach: every tenant is hostile, and the one-node cluster's bridge CNI,
// like many, enforces no NetworkPolicy, so what keeps a tenant out has to hold
// by itself. It must find buildkitd's port open at TCP but refusing BuildKit's
// client without a certificate of its CA (a build there is root on the node);
// the host's end of the node's link (every address the host listens on)
// unreachable; the kubelet and the API server refusing anonymous requests; no
// ServiceAccount token in the pod. What else it reaches (every Service and
// every listener of the node) is logged, with the known findings named.
func TestTenantPodIsolation(t *testing.T) {
	// A cluster kept up between runs (BEX_TEST_CLUSTER_ENV) may have it from
	// the last one: a new app each run, removed at the end.
	_, _, _ = bex("apps:destroy", "probe", "--confirm", "probe")
	t.Cleanup(func() { _, _, _ = bex("apps:destroy", "probe", "--confirm", "probe") })
	r := probeRepo(t, "probe")
	r.commit(t, "probe", map[string]string{"Dockerfile": probeDockerfile})
	start := time.Now()
	out, err := r.push()
	if err != nil {
		t.Fatalf("push (the gitserver builds with buildkitd over mutual TLS): %v\n%s", err, out)
	}
	t.Logf("the probe pushed and served in %.1f s (built by buildkitd over mutual TLS)", time.Since(start).Seconds())

	hc := httpsClient(t)
	ask := func(t *testing.T, path string, q url.Values, v any) {
		t.Helper()
		var body string
		testenv.Eventually(t, 30*time.Second, "the probe answers "+path, func() error {
			code, b, err := get(hc, "probe", path+"?"+q.Encode())
			if err == nil && code != 200 {
				err = fmt.Errorf("%d %.200s", code, b)
			}
			body = b
			return err
		})
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
	}
	one := func(t *testing.T, path string, q url.Values) probeResult {
		t.Helper()
		var res probeResult
		ask(t, path, q, &res)
		t.Logf("%s %s: connected=%v status=%d err=%q body=%.120q", path, res.Target, res.Connected, res.Status, res.Err, res.Body)
		return res
	}
	tcp := func(t *testing.T, addrs []string) []probeResult {
		t.Helper()
		var res []probeResult
		ask(t, "/tcp", url.Values{"addr": addrs}, &res)
		return res
	}

	nodeIP := netip.MustParseAddr(strings.TrimSpace(kubectl(t, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`)))
	// hack/clusterlocal: the node's link is a /30, the host's end the address below.
	hostIP := nodeIP.Prev()

	t.Run("buildkit's Secrets hold no CA key", func(t *testing.T) {
		// install-bex.sh's CA signs the two certificates and its key is gone:
		// each Secret holds the CA's certificate and one leaf, for one use.
		var ca *x509.Certificate
		for _, s := range []struct {
			name string
			use  x509.ExtKeyUsage
			dns  []string
		}{
			{"bex-buildkitd-tls", x509.ExtKeyUsageServerAuth, []string{"bex-buildkitd", "bex-buildkitd.bex-system", "bex-buildkitd.bex-system.svc", "bex-buildkitd.bex-system.svc.cluster.local"}},
			{"bex-buildkit-client-tls", x509.ExtKeyUsageClientAuth, nil},
		} {
			var secret struct{ Data map[string][]byte }
			if err := json.Unmarshal([]byte(kubectl(t, "-n", "bex-system", "get", "secret", s.name, "-o", "json")), &secret); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for k := range secret.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			if !slices.Equal(keys, []string{"ca.pem", "cert.pem", "key.pem"}) {
				t.Errorf("Secret %s holds %v, want ca.pem, cert.pem, key.pem", s.name, keys)
			}
			pair, err := tls.X509KeyPair(secret.Data["cert.pem"], secret.Data["key.pem"])
			if err != nil {
				t.Fatalf("Secret %s: %v", s.name, err)
			}
			leaf := pair.Leaf
			block, _ := pem.Decode(secret.Data["ca.pem"])
			if block == nil {
				t.Fatalf("Secret %s: ca.pem holds no PEM", s.name)
			}
			thisCA, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if ca != nil && !ca.Equal(thisCA) {
				t.Errorf("the two Secrets hold different CAs")
			}
			ca = thisCA
			if leaf.IsCA || leaf.CheckSignatureFrom(ca) != nil || bytes.Equal(leaf.RawSubjectPublicKeyInfo, ca.RawSubjectPublicKeyInfo) {
				t.Errorf("Secret %s: cert.pem is not a leaf of ca.pem with a key of its own", s.name)
			}
			if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{s.use}) || !slices.Equal(leaf.DNSNames, s.dns) {
				t.Errorf("Secret %s: extended key usage %v, names %v; want %v, %v", s.name, leaf.ExtKeyUsage, leaf.DNSNames, s.use, s.dns)
			}
		}
	})

	t.Run("no ServiceAccount token", func(t *testing.T) {
		if got := kubectl(t, "get", "deployment", "probe-web", "-o", "jsonpath={.spec.template.spec.automountServiceAccountToken}"); got != "false" {
			t.Errorf("the app's Deployment has automountServiceAccountToken %q, want false", got)
		}
		if res := one(t, "/token", nil); res.Connected || res.Err == "" {
			t.Errorf("the app's pod holds a ServiceAccount token: %s", res.Body)
		}
	})

	t.Run("buildkitd refuses a client without its certificate", func(t *testing.T) {
		addr := "tcp://bex-buildkitd.bex-system.svc.cluster.local:1234"
		plain := one(t, "/buildkit", url.Values{"addr": {addr}, "tls": {"none"}})
		if !plain.Connected {
			t.Logf("buildkitd's port is not reachable at TCP (%s): the CNI filtered it", plain.Err)
		} else {
			t.Logf("FINDING (known, expected on this CNI): buildkitd's port is reachable from an app's pod; the NetworkPolicy bex-buildkitd is not enforced, mutual TLS is what refuses it")
		}
		if plain.Err == "" || plain.Status != 0 {
			t.Errorf("BuildKit's client without TLS listed buildkitd's workers from an app's pod: %s", plain.Body)
		}
		noCert := one(t, "/buildkit", url.Values{"addr": {addr}, "tls": {"nocert"}})
		if noCert.Err == "" || noCert.Status != 0 {
			t.Errorf("BuildKit's client with TLS and no certificate listed buildkitd's workers from an app's pod: %s", noCert.Body)
		}
		if noCert.Connected && !containsAny(noCert.Err, "certificate required", "bad certificate", "broken pipe", "connection reset", "EOF") {
			t.Errorf("BuildKit's client with TLS and no certificate: %q, want the server's refusal of the handshake", noCert.Err)
		}
	})

	t.Run("the host's end of the node's link is unreachable", func(t *testing.T) {
		ports := hostListeners(t, hostIP)
		if !slices.Contains(ports, 22) {
			ports = append(ports, 22)
		}
		addrs := make([]string, len(ports))
		for i, p := range ports {
			addrs[i] = net.JoinHostPort(hostIP.String(), strconv.Itoa(p))
		}
		var reached []string
		for _, res := range tcp(t, addrs) {
			if res.Connected {
				reached = append(reached, res.Target)
			}
		}
		t.Logf("tried the host's listeners at %s, ports %v: %d reached", hostIP, ports, len(reached))
		if len(reached) > 0 {
			t.Errorf("an app's pod reaches the host's listeners: %v", reached)
		}
	})

	t.Run("the kubelet refuses anonymous requests", func(t *testing.T) {
		for _, path := range []string{"/pods", "/metrics", "/runningpods/"} {
			res := one(t, "/https", url.Values{"url": {"https://" + net.JoinHostPort(nodeIP.String(), "10250") + path}})
			if res.Status != 401 && res.Status != 403 {
				t.Errorf("the kubelet's %s to an anonymous client: %d %v %.200q, want 401 or 403", path, res.Status, res.Err, res.Body)
			}
		}
		// The read-only port is off.
		if res := tcp(t, []string{net.JoinHostPort(nodeIP.String(), "10255")}); res[0].Connected {
			t.Errorf("the kubelet's read-only port 10255 is open to an app's pod")
		}
	})

	t.Run("the API server refuses anonymous requests", func(t *testing.T) {
		for _, u := range []string{"https://10.96.0.1/api/v1/namespaces/bex-system/secrets", "https://10.96.0.1/version",
			"https://kubernetes.default.svc.cluster.local/apis/app.bex.co/v1alpha1/apps",
			"https://" + net.JoinHostPort(nodeIP.String(), "6443") + "/api/v1/pods"} {
			res := one(t, "/https", url.Values{"url": {u}})
			if res.Status != 401 && res.Status != 403 {
				t.Errorf("the API server's %s to an anonymous client: %d %v %.200q, want 401 or 403", u, res.Status, res.Err, res.Body)
			}
		}
	})

	t.Run("what else it reaches", func(t *testing.T) {
		// Every Service port (cluster IP and node port) and every listener of the
		// node's network namespace.
		type target struct{ addr, what string }
		var targets []target
		var svcs struct {
			Items []struct {
				Metadata struct{ Namespace, Name string }
				Spec     struct {
					ClusterIP string
					Ports     []struct {
						Port     int
						NodePort int
						Protocol string
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(kubectl(t, "get", "services", "-A", "-o", "json")), &svcs); err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs.Items {
			for _, p := range s.Spec.Ports {
				if p.Protocol != "TCP" {
					continue
				}
				what := fmt.Sprintf("Service %s/%s port %d", s.Metadata.Namespace, s.Metadata.Name, p.Port)
				if s.Spec.ClusterIP != "" && s.Spec.ClusterIP != "None" {
					targets = append(targets, target{net.JoinHostPort(s.Spec.ClusterIP, strconv.Itoa(p.Port)), what})
				}
				if p.NodePort != 0 {
					targets = append(targets, target{net.JoinHostPort(nodeIP.String(), strconv.Itoa(p.NodePort)), what + " (node port)"})
				}
			}
		}
		var pods struct {
			Items []struct {
				Metadata struct{ Namespace, Name string }
				Spec     struct {
					HostNetwork bool
					Containers  []struct {
						Ports []struct {
							ContainerPort int
							Protocol      string
						}
					}
				}
				Status struct{ PodIP string }
			}
		}
		if err := json.Unmarshal([]byte(kubectl(t, "get", "pods", "-A", "-o", "json")), &pods); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.HostNetwork || p.Status.PodIP == "" {
				continue // the node's listeners, below
			}
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Protocol != "" && cp.Protocol != "TCP" {
						continue
					}
					addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(cp.ContainerPort))
					targets = append(targets, target{addr, fmt.Sprintf("pod %s/%s port %d", p.Metadata.Namespace, p.Metadata.Name, cp.ContainerPort)})
				}
			}
		}
		for _, p := range nodeListeners(t) {
			targets = append(targets, target{net.JoinHostPort(nodeIP.String(), strconv.Itoa(p)), fmt.Sprintf("the node's listener :%d", p)})
		}
		addrs := make([]string, len(targets))
		for i, tg := range targets {
			addrs[i] = tg.addr
		}
		res := tcp(t, addrs)
		var report, unknown []string
		for i, r := range res {
			state := "refused or filtered"
			if r.Connected {
				state = "REACHED: " + knownListener(targets[i].what)
				if strings.HasSuffix(state, ": ") {
					unknown = append(unknown, targets[i].addr+" ("+targets[i].what+")")
					state += "UNKNOWN"
				}
			}
			report = append(report, fmt.Sprintf("%-22s %-55s %s", targets[i].addr, targets[i].what, state))
		}
		sort.Strings(report)
		t.Logf("from an app's pod (a TCP connection; what each then demands is checked above):\n%s", strings.Join(report, "\n"))
		if len(unknown) > 0 {
			t.Errorf("an app's pod reaches listeners that docs/architecture.md (\"Listeners on a cluster\") and knownListener do not name, so nobody checked how they authenticate: %v", unknown)
		}

		// bex's registry answers an app's pod 401: TestRegistryRequiresCredentials;
		// the deployer's metrics 401: TestDeployerMetricsNeedToken.
	})
}

// knownListener says how a listener an app's pod reaches authenticates its
// clients (docs/architecture.md, "Listeners on a cluster"), or "" for one that
// no row names. The first match counts.
func knownListener(what string) string {
	for _, k := range []struct{ re, why string }{
		{`^Service kube-system/kube-dns port 53$|^pod kube-system/coredns-[a-z0-9-]+ port 53$`, "DNS, public by design"},
		{`^Service default/kubernetes port 443$|^the node's listener :6443$`, "the API server: anonymous 401 (checked)"},
		{`^the node's listener :10250$`, "the kubelet: anonymous 401 (checked)"},
		{`^the node's listener :(80|443)$`, "the edge: public by design"},
		{`^Service bex-system/bex-gitserver port 22( \(node port\))?$|^pod bex-system/bex-gitserver-0 port 2222$`, "SSH: known users' keys only"},
		{`^Service bex-system/bex-hooks port 80$|^pod bex-system/bex-gitserver-0 port 8090$`, "webhooks' signatures, MCP's tokens"},
		{`^(Service|pod) bex-system/bex-buildkitd[a-z0-9-]* port 1234$`, "mutual TLS (checked)"},
		{`^(Service|pod) bex-system/bex-registry[a-z0-9-]* port 5000( \(node port\))?$`, "HTTP basic authentication, 401 without (checked: TestRegistryRequiresCredentials)"},
		{`^pod bex-system/bex-deployer-[a-z0-9-]+ port 9091$`, "metrics: HTTPS, a token allowed GET /metrics (checked: TestDeployerMetricsNeedToken)"},
		{`^pod bex-system/bex-deployer-[a-z0-9-]+ port 9092$`, "probes: FINDING: no authentication (ok or not, nothing else)"},
		{`^Service cnpg-system/cnpg-webhook-service port 443$|^pod cnpg-system/cnpg-controller-manager-[a-z0-9-]+ port 9443$`, "CloudNativePG's admission webhooks: TLS, no client authentication, as upstream's; they answer AdmissionReviews and change nothing (FINDING: anyone may ask)"},
		{`^(Service|pod) default/`, "an app's own port; FINDING: apps reach each other's pods, not only through the edge"},
	} {
		if regexp.MustCompile(k.re).MatchString(what) {
			return k.why
		}
	}
	return ""
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// hostListeners returns the TCP ports this machine's network namespace (the
// host's) listens on at every address or at ip.
func hostListeners(t *testing.T, ip netip.Addr) []int {
	t.Helper()
	var ports []int
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" { // LISTEN
				continue
			}
			host, port, _ := strings.Cut(fields[1], ":")
			p, _ := strconv.ParseInt(port, 16, 32)
			any := strings.Trim(host, "0") == ""
			v4 := ip.As4()
			mine := host == fmt.Sprintf("%02X%02X%02X%02X", v4[3], v4[2], v4[1], v4[0])
			if (any || mine) && !slices.Contains(ports, int(p)) {
				ports = append(ports, int(p))
			}
		}
	}
	sort.Ints(ports)
	return ports
}

// nodeListeners returns the TCP ports the node's network namespace listens on at
// an address other than loopback (hack/clusterlocal names it bex-<8 hex digits of
// sha256(DIR)>, DIR holding the kubeconfig).
func nodeListeners(t *testing.T) []int {
	t.Helper()
	sum := sha256.Sum256([]byte(filepath.Dir(env["KUBECONFIG"])))
	out, err := exec.Command("ip", "netns", "exec", "bex-"+hex.EncodeToString(sum[:4]), "ss", "-Htln").CombinedOutput()
	if err != nil {
		t.Fatalf("ss in the node's network namespace: %v\n%s", err, out)
	}
	var ports []int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 4 {
			continue
		}
		i := strings.LastIndex(fields[3], ":")
		host, port := fields[3][:i], fields[3][i+1:]
		if strings.HasPrefix(host, "127.") || host == "[::1]" {
			continue
		}
		if p, err := strconv.Atoi(port); err == nil && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	sort.Ints(ports)
	return ports
}
