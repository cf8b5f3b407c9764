// Command capdmgmt runs the management plane of hack/cluster-capd.sh on this
// machine: a kube-apiserver and etcd of its own, with Cluster API's CRDs and
// webhooks, and the four managers of one release (core, kubeadm bootstrap, kubeadm
// control plane and CAPD, the Docker provider, from bin/, built by make tools) as
// processes against it. CAPD makes each machine a Docker container, through the
// Docker socket (/var/run/docker.sock, or DOCKER_HOST).
//
//	capdmgmt up DIR     start it (detached) and wait until it is ready; again: nothing to do
//	capdmgmt down DIR   stop it; no process of it is left
//	capdmgmt serve DIR  the long-lived process that up starts
//
// Run it from the checkout (bin/ and hack/versions.env are found from the working
// directory up). Everything is under DIR/mgmt:
//
//	kubeconfig   an admin kubeconfig of its API server (rewritten at each start)
//	ready        exists while every part serves
//	pid          the serve process
//	etcd/        the API server's data, kept across down and up
//	logs/        capdmgmt.log (serve's own), and one log per manager
//
// serve supervises the managers (internal/machine/supervise: a manager that dies is
// restarted after a backoff); they, etcd and kube-apiserver have SIGKILL as their
// parent-death signal, so that nothing outlives serve, even killed. The managers
// listen on free loopback ports chosen at each start (internal/clusterapi), except
// that CAPD's manager always opens the debug server of its in-memory backend on
// port 19000 of every address: one management plane per machine.
package main
