// Package up runs the whole bex platform on one machine: what `bex up` does.
//
// It starts, in order, each waited for until it answers: containerd (unless one is
// given), buildkitd with a containerd worker, etcd and kube-apiserver (package
// controlplane), then installs bex's CRDs, writes STATE_DIR/kubeconfig, makes the
// admin key an admin, and starts bex's own components as child processes of the same
// binary: the deployer with the local runtime, the edge and the gitserver. A child
// that dies is restarted with backoff (package supervise). On stop everything ends in
// the reverse order, and the apps' containers are stopped before containerd is, so no
// process outlives `bex up`. The state dir keeps everything (the API's data, images,
// repositories, certificates, ports), so the next start brings every app back on the
// release it served, from the image it already has.
//
// The components run as separate processes rather than goroutines so that a crash of
// one (or a leak, or a stuck build) is contained, restarted and logged alone, exactly
// as the same components run as separate Deployments on a cluster.
//
// Each process gets a Go memory limit and GC target (memory.go): bex's components
// as their --go-memory-limit and --go-gc-percent, the other programs as GOMEMLIMIT
// and GOGC, so that the platform idles small (BenchmarkIdleMemory in cmd/bex/e2e).
package up
