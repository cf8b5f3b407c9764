// Package tokens keeps the bearer tokens of the agents' API: made for a User by
// `ssh bex@HOST tokens:create NAME`, shown once, stored hashed.
//
// A token is "bex_" and 43 characters of base64url (32 random bytes). Each is one
// Secret in the gitserver's secrets namespace (bex gitserver --secrets-namespace:
// bex-system on a cluster, the apps' namespace under bex up) named
// "agent-token-<hex SHA-256 of the token>", labelled with its user and name: the
// hash in the name makes verification one Get by name (no list, no cache of every
// token), and the token itself is stored nowhere. A plain SHA-256 suffices because the token is random and long; there is
// nothing to guess a dictionary from. A Secret rather than a field of the User,
// so that reading Users (every `kubectl get users`, the gitserver's cache) never
// carries credentials, and RBAC on Secrets guards them as any other credential.
// The token grants what its user may do at the time of each call: the User is read
// again on every verification, so removing the user or demoting them applies at
// once.
//
// A token belongs to a user, not to a name: its Secret carries the UID of the
// User it was made for (label app.bex.co/token-user-uid) and verifies only while
// the User of that name has that UID, so a user removed and made again under the
// same name never inherits the old one's tokens (users:remove deletes them too,
// RemoveOfUser). It records the SHA256 fingerprint of the SSH key whose session
// made it (annotation app.bex.co/key-fingerprint), shown by tokens:list, and
// verifies only while the User still holds that key: keys:remove deletes the
// key's tokens (RemoveOfKey), and Verify refuses any it left behind. Tokens
// made before this binding carry no UID and are refused, with a message saying
// to make a new one: nothing says whose they were. A token of the wrong shape
// (WellFormed) is refused before any read of the API server.
//
// A token may do less than its user: its Scope, fixed when it is made
// (tokens:create --apps A,B, --read-only), is stored on its Secret
// (annotations app.bex.co/token-apps, the sorted app names joined by commas,
// and app.bex.co/token-read-only, "true"), listed with it and returned by
// Verify. The store checks the apps are app names; which apps the maker may
// use, and what the scope allows, are the backend's rules. Annotations edited
// into something that does not parse make the token refused, not wider.
package tokens
