// Package pipeline is what turns code into a release, under the gitserver's SSH
// transport and its backend: the apps' bare repositories and a lock per app (one
// push, deploy, repack or removal of an app at a time), the build slots
// (Config.MaxConcurrentBuilds) and the build's timeout, the build (a Builder),
// the release and the wait for its rollout (a Releaser), the fetch of an app's
// upstream, deploy:image's pull (an ImageImporter), the background repacks and
// the disk margin (Config.MinFreeBytes, MinFreePercent).
//
// cmd/bex makes the Pipeline first and hands it, as a value, to the gitserver's
// Server (a push's build and release: BuildAndRelease) and to the backend
// (Deploy, DeployImage, RemoveRepository, the repositories' sizes and
// compaction), so that neither calls up into the other.
//
// Deploy rebuilds and rolls out an app outside a push, through the same steps as
// a push to its deploy branch. It fetches an app's upstream through package
// upstream's checked dialer, with the app's own deploy key or kept credentials
// (UpstreamAuth), never the host key. DeployImage (deploy:image) is a push
// without the build: under the app's lock an image is pulled into the app's
// image repository (an ImageImporter, which the caller gives: cmd/bex's
// builder/imageimport), then released and awaited as a push's.
//
// After a push, the app's repository is repacked in the background by the git
// binary's `gc --auto` under the app's lock, one repack at a time (repack.go).
// system:prune's `git gc --prune=now` (CompactRepository, storage.go) and its
// removal of images (IfIdle) take that lock without waiting for a push (at most
// 2 s, for a repack), so they never run while a push holds it.
//
// A push or a Deploy is refused at once, saying how much is free, when the state
// dir's file system has less than Config.MinFreeBytes or MinFreePercent free,
// whichever is smaller (disk.go); a pack that fills the disk part way is refused
// as cleanly, the repository left as it was.
//
// Its errors carry the backend's kinds. The Builder, Releaser, AppReader,
// ImageImporter and UpstreamAuth are interfaces declared here and wired by
// cmd/bex; the package imports no other component.
package pipeline
