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
	// CreateApp creates an app with owner as its first member, or returns
	// pipeline.ErrAppExists.
	CreateApp(ctx context.Context, name, owner string) (*pipeline.App, error)
	// SetDeployBranch records the app's deploy branch.
	SetDeployBranch(ctx context.Context, app, branch string) error
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
