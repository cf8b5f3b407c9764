// Package storage is the backend's Storage (system:df, system:prune and
// apps:info's bytes) on one machine: the policy that joins what each owner of
// the disk measures — the gitserver's repositories, the builder's logs and
// BuildKit's cache, the local runtime's logs, volumes and containerd's images
// — so that each byte is counted once and a prune frees what no Release
// keeps. The owners are reached through the small interfaces declared here
// (Builds, RuntimeDisk, ImageStore), in the vocabulary of internal/diskuse;
// cmd/bex wires them, on the local runtime only (on a cluster the disks are
// the nodes' and the registry's).
package storage
