// Package gitserver is bex's SSH git endpoint: `git push bex main` lands here.
//
// It authenticates users by public key alone (looked up through a Directory; the user
// is the one of the key whose signature verified), bounds what a client may hold
// before and after authenticating (limits.go), maps a repository path to an app, and
// serves
// git-receive-pack in process so that the push can build and deploy before any ref
// moves: the pack is stored, the Builder builds the new commit while its progress
// streams to the pusher as `remote:` lines, the Deployer records a release and rolls
// it out, and only then does the branch move and git print `ok`. Any failure rejects
// the push with a reason and leaves both the ref and what is serving untouched.
// git-upload-pack (clone, fetch) is served by the git binary.
//
// After a push, the app's repository is repacked in the background by the git
// binary's `gc --auto` under the app's push lock, one repack at a time (repack.go).
// system:prune's `git gc --prune=now` (CompactRepository, storage.go) and its
// removal of images (IfIdle) take that lock without waiting for a push (at most
// 2 s, for a repack), so they never run while a push holds it.
//
// Deploy fetches an app's upstream through package upstream's checked dialer,
// with the app's own deploy key or kept credentials (UpstreamAuth), never the
// host key. DeployImage (deploy:image) is a push without the build: under the
// app's lock an image is pulled into the app's image repository (Images, wired
// by cmd/bex to builder/imageimport), then released and awaited as a push's.
//
// Open sessions are checked again every Config.SessionRecheck (sessions.go): a
// session whose key is gone is closed, and one whose user may no longer use an app
// it works on (the push's or fetch's app, the apps a command read through the
// backend) is ended with one line saying why.
//
// A push or a Deploy is refused at once, saying how much is free, when the state
// dir's file system has less than Config.MinFreeBytes or MinFreePercent free,
// whichever is smaller (disk.go); a pack that fills the disk part way is refused
// as cleanly, the repository left as it was.
//
// The Builder, Deployer, Directory and UpstreamAuth are interfaces declared here
// and wired by cmd/bex; the package imports no other component.
package gitserver
