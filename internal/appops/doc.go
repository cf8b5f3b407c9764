// Package appops is what `ssh bex@HOST` commands and the agents' API both do to
// Apps, with one set of access rules: read an app the user may use, list them,
// change one (suspend, scale, config, rollback) and wait until the cache has seen
// the change. sshcmd prints its results; agentapi returns them as tool results.
//
// Refusals are *Error values with a Kind (not_found, forbidden, invalid,
// conflict) and a one-line message that says what to do; anything else is an
// internal failure. Who may do what: an admin everything; a member the apps whose
// spec.members lists it, by exact name.
package appops
