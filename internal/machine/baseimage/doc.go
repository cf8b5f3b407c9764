// Package baseimage makes base images without a registry.
//
// Debian's static busybox packed as a one-layer OCI image and imported into
// containerd as docker.io/library/busybox:latest, so that `FROM busybox` builds on
// a machine that cannot pull (with BuildKit's image-resolve-mode local): bex up
// --busybox-base, and the test harness.
//
// The Debian stand-ins for the official bases the plans of apps without a
// Dockerfile start from (standins.go): debian, node, golang, python and a
// distroless-like runtime, root file systems made by mmdebstrap from Debian's
// mirror, packed with go-containerregistry, kept in a machine-wide cache keyed by
// their content (Build) and imported under the names the caller configures
// (Import): bex up --local-bases, and testenv.SharedStandIns. They stand in for
// the official images; they are not them (Debian's Node 18 and Python 3.11).
//
// Two of them are the servers of managed databases rather than bases
// (servers.go): postgres and redis, Debian's PostgreSQL 15 and Redis 7 with a
// docker-entrypoint.sh that does what the official images' does for the way
// the deployer starts them (the first start initialises Postgres's data
// directory from POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB; the server
// runs as its own user, not root).
package baseimage
