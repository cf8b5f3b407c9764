// Package testenv starts the real daemons that bex's tests need, each on private
// sockets and ports under a temporary directory, and stops them when the test binary
// ends:
//
//   - a Kubernetes control plane (etcd + kube-apiserver through envtest) with bex's
//     CRDs installed;
//   - containerd, with its own root, state, socket and namespace;
//   - buildkitd with the containerd worker, so builds land in that containerd;
//   - a busybox base image made from Debian's busybox-static and imported into
//     containerd, so Dockerfiles can say `FROM busybox` without a registry;
//   - the Debian stand-ins for the plans' official bases (SharedStandIns, from
//     baseimage's machine-wide cache, built there by mmdebstrap the first time),
//     so the Go, Node and Python plans build and run without a registry;
//   - tiny one-layer images of any name and payload (ImportTinyImage), for tests
//     of what happens to images rather than what they run;
//   - Pebble, a real ACME server;
//   - nginx (Debian's package), the reference proxy of the edge's benchmark.
//
// The binaries come from bin/ (built by `make tools`) and from Debian's packages. A
// missing one fails the test with the command that installs it; nothing is skipped.
//
// A test package that uses the shared daemons runs its tests through Run:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
//
// and then asks for what it needs, started on first use:
//
//	cp := testenv.SharedControlPlane(t)
//
// The Start* functions start a private instance that the caller stops; the
// benchmarks use them to measure start-up.
package testenv
