// Package machine is the one-machine platform that `bex up` (cmd/bex/up) runs
// bex on, without a cluster. Its packages:
//
//   - controlplane: the embedded API (etcd and kube-apiserver with their PKI);
//   - daemons: containerd's and buildkitd's configuration, readiness and the runc
//     wrapper that confines build steps;
//   - supervise: children started in order, restarted, stopped in reverse;
//   - tenantnet: the tenants' CNI networks and egress rules;
//   - baseimage: busybox and the Debian stand-ins for the official base images,
//     for machines that reach no registry;
//   - imagebuild: bex's own image (`make image`), built with BuildKit.
//
// The local runtime (deployer/runtime/local), the edge and the test harness
// (internal/testenv) use some of them too; like everything under internal/, they
// import no component (cmd/bex/layout_test.go).
package machine
