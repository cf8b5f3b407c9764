// Package e2e holds the end-to-end tests of bex as a user meets it: `bex up` started
// as its own process on a temporary state dir and free loopback ports, apps pushed
// with the real git and ssh, answered over HTTPS through the edge with the local CA,
// managed with ssh commands and kubectl, and the whole platform stopped and started
// again. Nothing in it is faked; the package has no code outside its tests.
package e2e
