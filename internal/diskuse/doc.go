// Package diskuse is the vocabulary in which the owners of one machine's disk
// report what they hold, so that system:df and system:prune (gitserver/storage)
// can join their reports without either owner knowing the other: the
// builder's BuildKit cache records (builder.CacheUsage) and the local
// runtime's images in containerd (deployer/runtime/local.Images), whose
// blobs a cache record may share through its lease. Types only: each owner
// measures, the gitserver decides what counts where.
package diskuse
