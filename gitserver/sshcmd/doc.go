// Package sshcmd is the command tree of `ssh bex@HOST <command>`: apps, config,
// processes, releases, domains, logs, the audit trail (audit) and the edge's
// request figures of an app (metrics), access, keys, users, webhooks, tokens,
// managed databases (postgres:* and redis:*: create, list, info, link, unlink,
// destroy, and psql, backup, restore, cli as one-offs on the session's streams)
// and the machine's disk (system:df, system:prune),
// in the spirit of Heroku's and Dokku's command lines. It is a front-end of
// gitserver/backend: each command parses its words, calls one backend
// operation as the session's user, and prints.
//
// A fresh cobra tree is built for every session, its stdin, stdout and stderr bound
// to the session, so nothing of one session can leak into another. Arguments arrive
// split as a POSIX shell splits words (gitserver.SplitCommand) and are data from
// then on: nothing is evaluated. Every read command takes --json and prints the
// backend's view types, a documented, stable schema (docs/commands.md), for scripts
// and agents. Every error is one line on stderr with exit status 1 (exitStatus is
// the one mapping of the backend's error kinds); an internal one is also logged
// by the backend, which logs the audit line of every change too.
package sshcmd
