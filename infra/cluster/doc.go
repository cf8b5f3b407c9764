// Package cluster holds the tests of bex on a real Kubernetes cluster: one node
// started by hack/cluster-local.sh (the kubelet, containerd and runc of this
// machine), bex installed from infra/bex, apps pushed with the real git and ssh
// and fetched with the real curl through the edge DaemonSet. The cluster is started
// once for the test binary (TestMain) and stopped at its end, when down also
// checks that nothing of it is left.
//
// testdata/probe is a tenant's app (isolation_test.go) that reports what its pod
// reaches: the platform's listeners must refuse it by themselves, whatever the
// CNI enforces.
//
// databases_test.go runs CloudNativePG's operator (infra/cnpg) with the
// Postgres image that hack/cluster-local.sh makes from Debian's packages
// (CNPG_POSTGRES_IMAGE in cluster.env), through bex itself (postgres:*): an app
// linked to the database writes and reads, and with two instances its writes
// work again after the primary's pod is deleted. redis_test.go does the same
// for redis:* (REDIS_IMAGE is the Redis stand-in the same script pushes).
//
// BEX_TEST_CLUSTER_ENV=DIR/cluster.env runs the tests against a cluster already up
// (hack/cluster-local.sh up DIR), and leaves it up: for working on the tests.
package cluster
