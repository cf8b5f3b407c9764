// Package plan turns an app's source tree that has no Dockerfile into one: it detects
// the stack (Go, Ruby, PHP, Node, Python, a static site, or a bare Procfile) and writes a plain,
// commented Dockerfile that a person can read, copy into the repository and edit. It
// plays the part of Heroku's buildpacks or Railpack, but its whole output is a
// Dockerfile, shown as is by `ssh bex@host builds:plan APP` and `bex plan DIR`.
//
// The package owns:
//
//   - detection: which stack an app is, with the precedence Go (go.mod), Ruby
//     (Gemfile), PHP (composer.json or index.php), Node (package.json), Python
//     (requirements.txt or pyproject.toml), static site (index.html), Procfile
//     only; and the notes that say what it found;
//   - the generated Dockerfiles, one per stack: dependencies in a layer of their own,
//     a non-root user, PORT honoured (8080 when unset);
//   - the Procfile: its syntax (ParseProcfile, ReadProcfile), its web process as the
//     image's command, and the argv of each process type for the runtime
//     (Plan.Command);
//   - the base images, set by Config (official images in production, local ones in
//     tests).
//
// It does not look for a Dockerfile in the tree (the builder uses one directly when it
// is there), and it does not build (BuildKit does). It reads a few small files of the
// source tree it is given, and no other: links are followed only while they stay in
// the tree, since the tree is pushed by users. No network, no clock: the same tree and
// Config give the same Plan, byte for byte.
//
// # Images without a shell
//
// A Go app runs on Images.Runtime, a base with no shell by default (distroless). The
// Dockerfile's CMD is then the binary itself, and the Procfile's commands, web
// included, are returned in Plan.Processes for the runtime to run: Plan.Shell is false
// and Plan.Command splits such a command into words the way sh would, without running
// a shell. Every other stack's image has /bin/sh: its CMD runs the Procfile's web
// process with `sh -c`.
package plan
