// Package testregistry serves a real CNCF distribution registry (the code of
// the registry:3 image bex deploys on a cluster) in process on loopback, its
// blobs in a directory, and runs that registry's own garbage collection on
// it: for tests of what bex deletes from a registry and what the collection
// then frees on disk.
package testregistry
