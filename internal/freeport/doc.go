// Package freeport chooses TCP ports on loopback for daemons that are told their
// port before they listen (etcd and kube-apiserver under bex up, the test
// harness's servers), outside the kernel's ephemeral range.
package freeport
