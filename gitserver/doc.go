// Package gitserver is bex's SSH git endpoint: `git push bex main` lands here.
// It is a transport, beside sshcmd, mcpserver and webhook: what a push builds
// and releases, the repositories and their locks are its pipeline's
// (gitserver/pipeline), which cmd/bex makes first and hands to New.
//
// It authenticates users by public key alone (looked up through a Directory; the user
// is the one of the key whose signature verified), bounds what a client may hold
// before and after authenticating (limits.go), maps a repository path to an app, and
// serves git-receive-pack in process so that the push can build and deploy before
// any ref moves: under the app's lock the pack is stored, the pipeline builds the
// new commit while its progress streams to the pusher as `remote:` lines, records a
// release and waits for its rollout, and only then does the branch move and git
// print `ok`. Any failure rejects the push with a reason and leaves both the ref and
// what is serving untouched. git-upload-pack (clone, fetch) is served by the git
// binary.
//
// Open sessions are checked again every Config.SessionRecheck (sessions.go): a
// session whose key is gone is closed, and one whose user may no longer use an app
// it works on (the push's or fetch's app, the apps a command read through the
// backend) is ended with one line saying why.
//
// A push is refused at once, saying how much is free, when the state dir's file
// system is under the pipeline's disk margin; a pack that fills the disk part way
// is refused as cleanly, the repository left as it was.
//
// Who may push, and the app a first push makes, are the backend's decisions
// (Admission: backend.Backend's AdmitPush, CreatePushedApp and SetDeployBranch):
// the push carries them to git (one ERR line, or a rejected ref) and decides
// nothing itself.
//
// The Directory, Admission and Commands are interfaces declared here and wired by
// cmd/bex; the package imports no other component.
package gitserver
