// Package capd holds the tests of bex on a cluster whose machines are Docker
// containers: Cluster API with its Docker provider (CAPD), as hack/cluster-capd.sh
// makes it on this machine (a management plane of its own, one control plane and
// one worker, then a second), with bex installed from infra/bex, apps pushed with
// the real git and ssh and fetched with the real curl through the edge.
//
// The cluster is made once for the test binary (TestMain) and deleted at its end,
// when down is also checked to leave nothing: no container, Docker network,
// process or mount of it.
//
// BEX_TEST_CAPD_ENV=DIR/cluster.env runs the tests against a cluster already up
// (hack/cluster-capd.sh up DIR), and leaves it up: for working on the tests.
package capd
