package gitserver

import (
	"bytes"
	"context"
	"io"

	"github.com/gliderlabs/ssh"

	"bex.co/bex/gitserver/backend"
)

// A client asks for a pseudo-terminal (pty-req) before it says which command it
// runs (exec), and the answer is due before the command is known; so every
// pty-req is accepted (acceptPTY) and the session decides (sessionTTY): a `run`
// (or a database's client, postgres:psql and redis:cli) gets the terminal (its size, term, window changes), every other command runs
// as without one. Those write plain "\n" lines and git a binary protocol: on a
// client whose terminal ssh -t put in raw mode, "\n" alone would not return the
// cursor, so their output gets the "\r\n" a terminal's line discipline would
// make (git's commands are left as they are: git never asks for a terminal).
func acceptPTY(ssh.Context, ssh.Pty) bool { return true }

// isRun reports whether args are a command that gets a terminal: `run`, and the
// databases' clients, which run as one-offs too.
func isRun(args []string) bool {
	return len(args) > 0 && (args[0] == "run" || args[0] == "postgres:psql" || args[0] == "redis:cli")
}

// binaryOutput reports the commands whose stdout is a byte stream (a volume's
// tar archive, a database's dump), which a "\r\n" would corrupt.
func binaryOutput(args []string) bool {
	return len(args) > 0 && (args[0] == "volumes:backup" || args[0] == "postgres:backup")
}

// sessionTTY returns the terminal of a run session, fed with the window changes
// until ctx ends, or nil; stdout and stderr are what the other commands of a
// session with a terminal write to. The window changes are always read:
// gliderlabs/ssh blocks the session's requests on an unread one.
func sessionTTY(ctx context.Context, sess ssh.Session, args []string, isGit bool) (tty *backend.TTY, stdout, stderr io.Writer) {
	stdout, stderr = sess, sess.Stderr()
	pty, winCh, ok := sess.Pty()
	if !ok {
		return nil, stdout, stderr
	}
	if !isRun(args) {
		go func() {
			for range winCh {
			}
		}()
		if !isGit && !binaryOutput(args) {
			stdout, stderr = crlfWriter{sess}, crlfWriter{sess.Stderr()}
		}
		return nil, stdout, stderr
	}
	resize := make(chan backend.WindowSize, 1)
	go func() {
		for w := range winCh {
			ws := backend.WindowSize{Width: clampSize(w.Width), Height: clampSize(w.Height)}
			// The latest size wins: an older one not yet taken is replaced.
			select {
			case <-resize:
			default:
			}
			select {
			case resize <- ws:
			case <-ctx.Done():
			}
		}
	}()
	return &backend.TTY{Term: boundTerm(pty.Term), Width: clampSize(pty.Window.Width), Height: clampSize(pty.Window.Height), Resize: resize}, stdout, stderr
}

func clampSize(n int) uint16 { return uint16(min(max(n, 0), 10000)) }

// boundTerm keeps a client's TERM short and printable.
func boundTerm(t string) string {
	if len(t) > 64 {
		t = t[:64]
	}
	for _, c := range []byte(t) {
		if c <= ' ' || c > '~' || c == '=' {
			return "xterm"
		}
	}
	if t == "" {
		return "xterm"
	}
	return t
}

// crlfWriter turns "\n" into "\r\n".
type crlfWriter struct{ w io.Writer }

func (c crlfWriter) Write(p []byte) (int, error) {
	if _, err := c.w.Write(bytes.ReplaceAll(p, []byte("\n"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}
