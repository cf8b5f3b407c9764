// Package testapps holds the tenants' apps that the cluster tests (infra/cluster
// on the one-node cluster, infra/capd on the cluster of containers) push through
// bex: the probe, which reports from inside its pod what it reaches
// (infra/cluster/testdata/probe, its program), and the notes app, which writes and
// reads a managed Postgres through the DATABASE_URL bex links. One copy for both
// suites, so that both make the same attack and the same check.
package testapps
