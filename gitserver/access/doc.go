// Package access is the gitserver's Directory backed by bex's API objects: it answers
// "whose key is this?" from the cluster-scoped Users and "does this app exist, who are
// its members, which branch deploys?" from the Apps of one namespace. It writes
// nothing: the app a first push makes and its deploy branch are the backend's
// (backend.CreatePushedApp, SetDeployBranch).
//
// Reads come from a controller-runtime informer cache, never from the API server:
// the SSH path asks on every connection, and a watch keeps the cache current, so a key
// added to or removed from a User takes effect on the next connection without a
// restart. A key is found through a field index on Users (KeyFingerprintField) that
// maps each key's SHA256 fingerprint to its holders; the full key is then compared, and
// a key held by two users is refused rather than resolved to either of them.
//
// Set-up order: build the cache (cache.New, or a manager's GetCache), call New, which
// registers the index and the informers, then start the cache and wait for it to sync.
// Lookups before the cache has started fail.
package access
