package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
)

// Fixed addresses inside the node's network namespace: they are private to it, so
// they never meet the host's networks. Only the veth link's /30 is seen by the host,
// and it is derived from DIR so that two clusters can run side by side.
const (
	podCIDR          = "10.244.0.0/24"
	serviceCIDR      = "10.96.0.0/16"
	apiService       = "10.96.0.1"  // the first address of serviceCIDR: kubernetes.default
	dnsService       = "10.96.0.10" // CoreDNS
	nodeName         = "bex-local"
	apiPort          = 6443
	sshNodePort      = 30022 // the gitserver's Service, patched to NodePort
	registryNodePort = 30500
	clusterDomain    = "cluster.local"
	// pauseImage is the pods' sandbox image, built here (hack/nodeimages) and
	// imported before the kubelet's first pod: containerd never pulls it.
	pauseImage = "bex.local/pause:3.10"
)

// layout names everything of one cluster: its files under dir, and the names and
// addresses derived from dir.
type layout struct {
	dir string
	id  string // 8 hex digits of sha256(dir)

	hostIP netip.Addr // the host's end of the veth pair
	nodeIP netip.Addr // the node's end: the API server, the kubelet, node ports, the edge

	// extraPatches are kustomize patches over infra/bex added to bexPatches
	// (install-capd's).
	extraPatches string
}

func newLayout(dir string) (*layout, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("DIR must be an absolute path, not %q", dir)
	}
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	l := &layout{dir: filepath.Clean(dir), id: hex.EncodeToString(sum[:4])}
	// 10.213.A.B/30 with B a multiple of 4: 16384 links.
	base := netip.AddrFrom4([4]byte{10, 213, sum[0], (sum[1] & 0x3f) * 4})
	l.hostIP = base.Next()
	l.nodeIP = l.hostIP.Next()
	return l, nil
}

func (l *layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.dir}, elem...)...)
}

func (l *layout) netns() string    { return "bex-" + l.id }
func (l *layout) hostVeth() string { return "bex" + l.id } // 11 bytes, under IFNAMSIZ
// cgroupRoot holds everything the cluster runs: the node's daemons (and
// containerd's shims, its children) in node/, the kubelet's pods in pods/ (its
// cgroupRoot). down ends every task under it, whatever reparenting did.
func (l *layout) cgroupRoot() string        { return "/bex-" + l.id }
func (l *layout) kubeletCgroupRoot() string { return l.cgroupRoot() + "/pods" }
func (l *layout) nodeCgroup() string        { return l.cgroupRoot() + "/node" }

func (l *layout) pki(name string) string { return l.path("pki", name) }
func (l *layout) kubeconfig() string     { return l.path("kubeconfig") }
func (l *layout) componentKubeconfig(name string) string {
	return l.path("kubeconfigs", name+".kubeconfig")
}
func (l *layout) containerdSocket() string   { return l.path("containerd", "containerd.sock") }
func (l *layout) logFile(name string) string { return l.path("logs", name+".log") }
func (l *layout) nodePIDFile() string        { return l.path("node.pid") }
func (l *layout) envFile() string            { return l.path("cluster.env") }
func (l *layout) apiURL() string             { return fmt.Sprintf("https://%s:%d", l.nodeIP, apiPort) }
