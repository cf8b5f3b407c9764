// Command clusterlocal runs a one-node Kubernetes cluster on this machine from the
// binaries hack/tools.sh builds (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, the kubelet and kube-proxy), with Debian's containerd and runc as
// the container runtime and Debian's CNI plugins for the pod network, and installs
// bex on it from infra/bex. hack/cluster-local.sh is its front door:
//
//	hack/cluster-local.sh up DIR     start the node, install bex, write DIR/cluster.env
//	hack/cluster-local.sh down DIR   stop everything; no process, mount or device is left
//
// Everything lives under DIR, in a network namespace of its own (bex-<id>, where id
// comes from DIR) joined to the host by one veth pair (host 10.213.x.y+1, node +2),
// and in a mount namespace of its own with a private /run: the kubelet's volume
// mounts, containerd's pod network namespaces and runc's state never reach the host's
// mount table, and they end with the node's processes. The kubelet's cgroups are
// under /bex-<id> in each cgroup v1 hierarchy and are removed by down.
//
// The node process (clusterlocal node DIR, started by up inside those namespaces)
// supervises the daemons with internal/machine/supervise; down sends it SIGTERM, it removes
// every pod's containers through containerd, then stops the daemons in reverse
// order. Why each setting is what it is: docs/cluster.md ("A cluster on this machine").
package main
