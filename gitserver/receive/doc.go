// Package receive is the git side of a push, on go-git's plumbing: it advertises a
// bare repository's refs, reads the update request, stores the pushed pack (thin packs
// completed from the repository's own objects, then indexed), checks that every new
// object's references resolve, moves refs with compare-and-swap lock files, and writes
// the report that git prints.
//
// It never moves a ref on its own: the caller stores the pack, decides (builds,
// deploys), and only then calls UpdateRef. Until then the pushed objects sit in the
// repository unreferenced, which git itself tolerates, so a crash between the two steps
// leaves the repository valid and every ref at its old value.
//
// go-git v5's own receive-pack server has no side-band, no hooks and no thin-pack
// support when writing packs to disk; this package composes its pieces (pktline,
// packp, capability, packfile, idxfile) instead.
package receive
