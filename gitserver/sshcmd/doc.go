// Package sshcmd is the command tree of `ssh bex@HOST <command>`: apps, config,
// processes, releases, domains, logs, access, keys and users, in the spirit of
// Heroku's and Dokku's command lines.
//
// A fresh cobra tree is built for every session, its stdin, stdout and stderr bound
// to the session, so nothing of one session can leak into another. Arguments arrive
// split as a POSIX shell splits words (gitserver.SplitCommand) and are data from
// then on: nothing is evaluated. Every read command takes --json and prints a
// documented, stable schema (docs/commands.md), for scripts and agents. Every
// refusal is one line on stderr saying what was wrong and what to do, with a
// non-zero exit status; every change is one "audit" line in the log, naming the
// user, the key, the command and the app.
//
// The backend is the App API: reads of Apps and Users come from a cache (Config.
// Reader), writes go to the API server (Config.Client) and then wait, briefly, until
// the cache has seen them, so that the next command reads its own writes. Config
// changes and rollbacks are releases recorded through deployer/releases and awaited
// like a push; scaling, suspending, domains and access edit the App's spec; a restart
// is an annotation (v1alpha1.RestartedAtAnnotation) the deployer passes to its
// runtime. Runtime logs, build logs and the removal of an app's repository come
// through small interfaces that cmd/bex wires.
//
// Who may do what: an admin everything; a member everything on the apps that list
// it in spec.members, its own keys, and creating apps when its User allows it
// (spec.canCreateApps), becoming the new app's member. Names are compared exactly.
package sshcmd
