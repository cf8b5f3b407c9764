// Package daemons knows how bex runs the daemons of a machine that are not its own
// code: containerd and buildkitd. It writes their configuration (each with a private
// root, state and socket under one directory, so that several can share a machine
// and none touches /run or /var/lib of a system daemon), gives their arguments and
// readiness checks, and cleans up what they leave behind (containerd's shims, which
// daemonise away from containerd by design). buildkitd's configuration carries the
// build cache's GC policy (buildcache.go).
//
// `bex up` and the test harness (internal/testenv) both start them from here.
package daemons
