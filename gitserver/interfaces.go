package gitserver

import (
	"context"
	"io"

	gossh "golang.org/x/crypto/ssh"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// Directory answers who a key belongs to and what apps exist. Implementations cache:
// the SSH path calls it on every connection.
type Directory interface {
	// UserByKey returns the user who owns key, or ErrUnknownKey.
	UserByKey(ctx context.Context, key gossh.PublicKey) (*backend.User, error)
	// App returns an app, or pipeline.ErrAppNotFound.
	App(ctx context.Context, name string) (*pipeline.App, error)
}

// Admission decides a push: who may push to an app and the app made on its first
// push. It is the backend's (backend.Backend), so that a push and the commands
// keep one rule; the SSH server only carries what it decides to git.
type Admission interface {
	// AdmitPush returns the app user may push to (Exists false: the push is its
	// first, and the app is to be created), or a backend.Forbidden error whose
	// message is git's one line.
	AdmitPush(ctx context.Context, user *backend.User, name string) (*backend.PushTarget, error)
	// CreatePushedApp makes the app of a first push with user as its first
	// member; when another made it meanwhile, user's access to it is checked
	// (backend.Forbidden).
	CreatePushedApp(ctx context.Context, user *backend.User, name string) (*backend.PushTarget, error)
	// SetDeployBranch records the app's deploy branch.
	SetDeployBranch(ctx context.Context, user *backend.User, name, branch string) error
	// Pushed keeps how a push's deploy ended in the audit trail.
	Pushed(user *backend.User, name string, d backend.PushDone)
}

// Commands runs the commands of `ssh bex@HOST <command>`: every session whose
// command is not git's.
type Commands interface {
	// Run runs one session's command and returns its exit status. It returns when
	// the command is done or ctx ends (the client left, the key was removed). It
	// writes what went wrong to s.Stderr itself.
	Run(ctx context.Context, s CommandSession) int
}

// CommandSession is one SSH session running a command.
type CommandSession struct {
	// User is who authenticated, looked up again inside the session.
	User *backend.User
	// KeyFingerprint is the SHA256 fingerprint of the key the session was
	// authenticated with ("SHA256:...").
	KeyFingerprint string
	// Args are the words of the command (SplitCommand); empty for `ssh bex@HOST`.
	Args   []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY is the session's pseudo-terminal (ssh -t: its term, size and window
	// changes); nil without one. Only `run` sessions get one (AcceptsPTY).
	TTY *backend.TTY
}

// ErrUnknownKey is a Directory's error for a key no user holds.
var ErrUnknownKey error = &backend.Error{Kind: backend.Forbidden, Msg: "unknown key"}
