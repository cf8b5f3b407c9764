package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// writeConfigs writes every daemon's configuration under DIR. They are written on
// each up, so a changed checkout's settings apply to a cluster brought up again.
// bin is where `make tools` built the daemons (the node's runc among them).
func (l *layout) writeConfigs(bin string) error {
	pullAuth, err := l.kubeletRegistryAuth()
	if err != nil {
		return err
	}
	files := map[string]string{
		l.kubeconfig():                                              l.kubeconfigFor("admin"),
		l.path("containerd", "config.toml"):                         l.containerdConfig(filepath.Join(bin, "runc")),
		l.path("cni", "net.d", "10-bex-pods.conflist"):              l.cniConfig(),
		l.path("config", "kubelet.yaml"):                            l.kubeletConfig(),
		l.path("config", "kube-proxy.yaml"):                         l.proxyConfig(),
		l.path("config", "resolv.conf"):                             "nameserver " + dnsService + "\n",
		l.path("containerd", "certs.d", registryHost, "hosts.toml"): l.registryMirror(),
		l.path("kubelet", "config.json"):                            pullAuth,
	}
	for _, c := range []string{"kubelet", "controller-manager", "scheduler", "proxy"} {
		files[l.componentKubeconfig(c)] = l.kubeconfigFor(c)
	}
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// kubeconfigFor is a kubeconfig with the client certificate of one identity.
func (l *layout) kubeconfigFor(cert string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: bex-local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: bex-local
  context: {cluster: bex-local, user: %s}
current-context: bex-local
`, l.apiURL(), l.pki("ca.crt"), cert, l.pki(cert+".crt"), l.pki(cert+".key"), cert)
}

// registryHost is the name the deployer gives app images (infra/bex: the
// registry's Service). containerd on the node does not use the cluster's DNS, so
// its registry configuration sends that name to the Service's node port: as the
// server, not as a mirror in front of it, so that an image the registry does not
// have is reported with the registry's answer (not found), not with containerd's
// fallback to a name the node cannot resolve.
const registryHost = "bex-registry.bex-system.svc.cluster.local:5000"

func (l *layout) registryMirror() string {
	return fmt.Sprintf(`server = "http://%s:%d"

[host."http://%s:%d"]
  capabilities = ["pull", "resolve"]
`, l.nodeIP, registryNodePort, l.nodeIP, registryNodePort)
}

// kubeletRegistryAuth is the kubelet's Docker config.json ({--root-dir}/config.json,
// which the kubelet reads for every pull and hands to containerd with it): the
// registry's user node, whose password hack/install-bex.sh puts in the
// registry's htpasswd (REGISTRY_NODE_PASSWORD). On the node, not in any Secret
// or pod: no tenant reads it. Not containerd's registry.configs auth, which
// containerd deprecates (removed in 2.7) and which disables its transfer
// service; the kubelet's file works with every containerd, as on Cluster API's
// nodes (infra/clusterapi).
func (l *layout) kubeletRegistryAuth() (string, error) {
	p, err := l.registryNodePassword()
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(map[string]any{"auths": map[string]any{registryHost: map[string]string{"username": registryNodeUser, "password": p}}})
	return string(b) + "\n", err
}

// registryNodeUser is the registry's user of the nodes' pulls (install-bex.sh).
const registryNodeUser = "node"

// registryNodePassword is the node user's password: made on the first up and
// kept in DIR, as the cluster's Secrets are kept in its etcd there (an up again
// in the same DIR keeps the registry's htpasswd).
func (l *layout) registryNodePassword() (string, error) {
	p := l.path("config", "registry-node-password")
	if b, err := os.ReadFile(p); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b)), nil
	} else if err != nil && !os.IsNotExist(err) {
		return "", err
	}
	var r [24]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	pw := hex.EncodeToString(r[:])
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	return pw, os.WriteFile(p, []byte(pw+"\n"), 0o600)
}

// containerdConfig: containerd 1.6's CRI with runc, its own root, state and socket
// under DIR. restrict_oom_score_adj: this machine's root has no CAP_SYS_RESOURCE,
// so the sandbox's default OOM score (-998, lower than containerd's own) cannot be
// set, and runc fails every pod with "can't get final child's PID from pipe"; with
// it, containers get at least containerd's score. runc is bin/runc, as under bex up
// (BinaryName: Debian's 1.1.5 lacks the 2025 fixes).
func (l *layout) containerdConfig(runc string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, l.path("containerd", "root"), l.path("containerd", "state"), l.containerdSocket(),
		pauseImage, l.path("cni", "net.d"), runc, l.path("containerd", "certs.d"))
}

// cniConfig: one bridge in the node's network namespace, with host-local
// addresses kept under DIR. hairpinMode lets a pod reach itself through a
// Service; ipMasq is off because no traffic leaves the node for anywhere but the
// host's end of the veth.
func (l *layout) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "bex-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR, l.path("cni", "ipam"))
}

// kubeletConfig: failCgroupV1 false because this machine runs cgroup v1 (the
// kubelet of 1.37 refuses it by default); cgroupfs because no systemd runs;
// a cgroupRoot of its own so that down can end and remove exactly this cluster's;
// eviction off and image garbage collection at 100% so that a full disk on the
// developer's machine does not evict bex or delete the imported images (nothing
// can be pulled again here).
func (l *layout) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
tlsCertFile: %s
tlsPrivateKeyFile: %s
clusterDNS: [%s]
clusterDomain: %s
resolvConf: %s
podLogsDir: %s
failSwapOn: false
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 60
`, l.kubeletCgroupRoot(), l.containerdSocket(), l.nodeIP, l.pki("ca.crt"), l.pki("kubelet.crt"), l.pki("kubelet.key"),
		dnsService, clusterDomain, l.path("config", "resolv.conf"), l.path("pod-logs"))
}

// proxyConfig: iptables in the node's network namespace (its rules go with it).
// masqueradeAll: the bridge has no br_netfilter guarantee, so a pod reaching a
// Service whose endpoint is on the same bridge gets its reply through the node's
// stack only when the traffic is masqueraded.
func (l *layout) proxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [%s/32]
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
`, l.componentKubeconfig("proxy"), podCIDR, nodeName, l.nodeIP, l.nodeIP)
}
