// Package backend is everything that comes in through the gitserver, below the
// front-ends that parse, call and print: the ssh commands (package sshcmd), the
// MCP server (package mcpserver) and the webhook handler (package webhook). It
// owns the identity a request acts as (User), the operations on apps, config
// vars, domains, processes, releases, deploys, access, users, keys, tokens,
// webhook secrets, upstreams (checked by package upstream's Policy, with their
// credentials and each app's deploy key in hooksecrets) and logs, the access rules, one set of view types for every
// front-end's output, and one error type with kinds.
//
// Who may do what: an admin everything; a member everything on the apps whose
// spec.members lists it (by exact name), its own keys and tokens, and creating
// apps when its User allows it (spec.canCreateApps), becoming the new app's
// member. Users are managed by admins. A bearer token may be limited below its
// user (User.Scope, tokens:create --apps and --read-only): limited to some apps,
// it may use those only (MayUseApp; any other name is Forbidden before it is
// read, whether it exists or not) and the databases linked to them; read-only,
// every operation that changes something refuses it first (mayChange, called
// at the top of each; scope_test.go lists every exported method as changing or
// not and fails on one it does not know); limited either way, it has none of
// its user's powers beyond apps (unlimited: users, keys, tokens, registries,
// the disk, creating apps and databases, webhook settings, a database's
// members and its destruction, an admin's wildcard and platform domains). A
// push is admitted here too (push.go:
// AdmitPush, CreatePushedApp on the first push, SetDeployBranch), so that the
// SSH server that carries it decides nothing of its own.
//
// Errors are *Error values with a Kind (NotFound, Forbidden, Invalid, Conflict,
// Failed) and a one-line message that says what to do; matched with errors.Is
// against ErrNotFound and its siblings, or read with KindOf. Anything else is
// Internal. Each front-end maps the kinds once: sshcmd to a line and an exit
// status, mcpserver to a tool error's code, webhook to an HTTP status.
//
// A long request carries a Uses in its context (WithUses): every operation that
// reads an app for a user records it there, so that the server can check the
// user again while the request runs (StillMayUse, Recheck: the same MayUse rule)
// and end it when access is withdrawn.
//
// Databases (databases.go: postgres:*, redis:*, the MCP database tools) are
// Database objects the backend creates and deletes, and links: a config var
// whose value is a reference to the database's credentials Secret (never the
// value: the backend reads no Secret of the apps' namespace, but through
// Config.ConfigSecrets for ConfigValues, which masks config values in what
// agents are shown of an app's output and is never returned), recorded as a
// release as config:set's are; psql, backups, restores and redis-cli run as
// one-offs from the database's image through Config.Runner. A user sees the
// databases whose spec.members lists them (admins all); any other answers as
// one that does not exist.
//
// Reads of Apps and Users come from a cache (Config.Reader); writes go to the
// API server (Config.Client) and then wait, briefly, until the cache has seen
// them, so that the next request reads its own writes. Config changes and
// rollbacks are releases recorded through Config.Releases; deploys and webhook
// redeploys run through Config.Deployer (gitserver/pipeline, made before the
// backend and handed to it as a value: the backend calls nothing above it), and
// deploy:image through Config.Images (the same pipeline with a pull in place of
// the build; registry:login's check through Config.Registries); logs
// come from Config.Logs and Config.Builds, and the disk's usage and pruning
// (system:df, system:prune: admins; an app's own bytes in apps:info) from
// Config.Storage, with the images each app's Releases keep: small interfaces cmd/bex wires, so
// the package imports no other component. Every change is one "audit" line in
// the log naming the user, the key, the command and the app.
package backend
