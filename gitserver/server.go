package gitserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/gliderlabs/ssh"
	"github.com/prometheus/client_golang/prometheus"
	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// Server is the SSH git endpoint.
type Server struct {
	cfg Config
	dir Directory
	// admit decides who may push and makes the app of a first push.
	admit Admission
	// pipeline builds and releases what a push brings, and owns the
	// repositories and their locks.
	pipeline *pipeline.Pipeline
	commands Commands // nil: only git
	log      *slog.Logger
	metrics  *metrics

	ssh *ssh.Server

	sessions sessions
	// unauth counts the connections not yet authenticated.
	unauth unauthLimiter
	// stop ends the session recheck loop.
	stop    context.CancelFunc
	stopCtx context.Context
}

// Option configures a Server beyond its Config.
type Option func(*Server)

// WithCommands serves `ssh bex@HOST <command>`: sessions whose command is not git's
// go to c. Without it such sessions get one line saying what the server takes.
func WithCommands(c Commands) Option { return func(s *Server) { s.commands = c } }

// context keys of a connection.
type ctxKey string

const (
	ctxUser     ctxKey = "bex-user"     // *verified, set once a signature verified
	ctxPending  ctxKey = "bex-pending"  // *pendingConn, until authenticated
	ctxSessions ctxKey = "bex-sessions" // *atomic.Int32, the open session channels
)

// New makes a server that looks keys and apps up in dir, admits its pushes
// through adm (the backend) and runs them through p. reg receives its metrics
// (nil: not registered).
func New(cfg Config, dir Directory, adm Admission, p *pipeline.Pipeline, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withPaths()
	if dir == nil || adm == nil || p == nil {
		return nil, errors.New("gitserver: a Directory, an Admission and a Pipeline are required")
	}
	if log == nil {
		log = slog.Default()
	}
	signer, err := loadOrCreateHostKey(cfg.HostKeyPath)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, dir: dir, admit: adm, pipeline: p,
		log:     log.WithGroup("gitserver"),
		metrics: newMetrics(reg),
		unauth: unauthLimiter{perSource: cfg.MaxUnauthPerSource, total: cfg.MaxUnauthConns,
			queuedPerSource: cfg.MaxUnauthQueuedPerSource, queuedTotal: cfg.MaxUnauthQueued},
	}
	for _, o := range opts {
		o(s)
	}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	s.ssh = &ssh.Server{
		Addr:             cfg.Addr,
		Handler:          s.handleSession,
		HostSigners:      []ssh.Signer{signer},
		Version:          "bex",
		PublicKeyHandler: s.publicKeyHandler,
		// No password or keyboard-interactive handler: those methods are refused.
		// No forwarding callbacks: port forwarding is refused; agent and X11
		// forwarding are never set up.
		ConnCallback: s.connCallback,
		// The identity comes from the key whose signature verified: x/crypto calls
		// VerifiedPublicKeyCallback for that key only (gliderlabs/ssh leaves the
		// field alone when it fills in the rest of the config).
		ServerConfigCallback: func(ctx ssh.Context) *gossh.ServerConfig {
			return &gossh.ServerConfig{
				VerifiedPublicKeyCallback: func(_ gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, _ string) (*gossh.Permissions, error) {
					return s.verifiedKey(ctx, key, perms)
				},
			}
		},
		ChannelHandlers: map[string]ssh.ChannelHandler{"session": s.sessionChannel},
		IdleTimeout:     cfg.IdleTimeout,
		PtyCallback:     acceptPTY, // a run's terminal: see pty.go
		ConnectionFailedCallback: func(conn net.Conn, err error) {
			s.log.Debug("ssh handshake failed", "remote", conn.RemoteAddr().String(), "err", err)
		},
	}
	return s, nil
}

// HostKey is the server's public host key, for known_hosts.
func (s *Server) HostKey() gossh.PublicKey { return s.ssh.HostSigners[0].PublicKey() }

// Serve accepts connections on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	go s.recheckSessions(s.stopCtx)
	err := s.ssh.Serve(l)
	if errors.Is(err, ssh.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting, waits for the sessions to end (or ctx to), then
// closes what is left. The pipeline's background deploys and repacks are its
// own to end (pipeline.Shutdown), after every front-end is shut.
func (s *Server) Shutdown(ctx context.Context) error {
	defer s.stop()
	s.unauth.close() // the connections waiting for a slot are not served
	err := s.ssh.Shutdown(ctx)
	if err != nil && !errors.Is(err, ssh.ErrServerClosed) {
		_ = s.ssh.Close()
		return err
	}
	return nil
}

// publicKeyHandler answers whether a key may be tried: it belongs to a user. It
// runs for every key a client offers, before any signature, so it records nothing:
// who the connection is comes from verifiedKey, for the key whose signature
// verified.
func (s *Server) publicKeyHandler(ctx ssh.Context, key ssh.PublicKey) bool {
	_, err := s.lookupKey(ctx, key)
	return err == nil
}

// verifiedKey runs once a signature by key has verified (x/crypto's
// VerifiedPublicKeyCallback): it resolves the user of that key, records both on
// the connection and ends the handshake's limits. A client may offer one key and
// sign with another (soft-serve's bypass); only this key counts.
func (s *Server) verifiedKey(ctx ssh.Context, key gossh.PublicKey, perms *gossh.Permissions) (*gossh.Permissions, error) {
	user, err := s.lookupKey(ctx, key)
	if err != nil {
		return nil, errors.New("permission denied")
	}
	ctx.SetValue(ctxUser, &verified{user: user, key: key})
	if p, ok := ctx.Value(ctxPending).(*pendingConn); ok {
		p.authenticate()
	}
	return perms, nil
}

func (s *Server) lookupKey(ctx context.Context, key gossh.PublicKey) (*backend.User, error) {
	lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	user, err := s.dir.UserByKey(lookup, key)
	if err != nil && !errors.Is(err, ErrUnknownKey) {
		s.log.Warn("key lookup failed", "fingerprint", gossh.FingerprintSHA256(key), "err", err)
	}
	return user, err
}

// verified is who a connection authenticated as, and with which key.
type verified struct {
	user *backend.User
	key  gossh.PublicKey
}

// authenticatedUser returns the user and key of a session: the ones verifiedKey
// recorded. gliderlabs/ssh's own Session.PublicKey is the last key its callback
// accepted, which need not be the key that signed, so it is not used.
func (s *Server) authenticatedUser(sess ssh.Session) (*backend.User, gossh.PublicKey, error) {
	v, _ := sess.Context().Value(ctxUser).(*verified)
	if v == nil || v.user == nil {
		return nil, nil, errors.New("no verified key on this connection")
	}
	return v.user, v.key, nil
}

// handleSession runs one SSH session: a git command, a bex command, or an
// explanation.
func (s *Server) handleSession(sess ssh.Session) {
	user, key, err := s.authenticatedUser(sess)
	if err != nil {
		s.log.Warn("session refused", "remote", sess.RemoteAddr().String(), "err", err)
		fatal(sess, "access denied")
		return
	}
	fp := gossh.FingerprintSHA256(key)
	// ctx ends when the session is ended: its key, role or access withdrawn.
	ctx, untrack := s.track(sess, user, key)
	defer untrack()
	args, err := SplitCommand(sess.RawCommand())
	if err != nil {
		fmt.Fprintf(sess.Stderr(), "bex: %v: quote arguments for a POSIX shell\n", err)
		_ = sess.Exit(2)
		return
	}
	isGit := len(args) > 0 && (args[0] == "git-receive-pack" || args[0] == "git-upload-pack")
	tty, stdout, stderr := sessionTTY(ctx, sess, args, isGit)
	if !isGit && s.commands != nil {
		code := s.commands.Run(ctx, CommandSession{
			User: user, KeyFingerprint: fp, Args: args,
			Stdin: sess, Stdout: stdout, Stderr: stderr, TTY: tty,
		})
		_ = sess.Exit(code)
		return
	}
	if len(args) == 0 {
		fmt.Fprintf(sess.Stderr(), "Hi %s! This is bex: push with `git push ssh://git@HOST:PORT/<app> main`.\n", user.Name)
		_ = sess.Exit(1)
		return
	}
	if !isGit {
		fmt.Fprintf(sess.Stderr(), "bex: unknown command %q: this server takes git push and git clone\n", args[0])
		_ = sess.Exit(1)
		return
	}
	if len(args) != 2 {
		fatal(sess, "usage: "+args[0]+" '<app>'")
		return
	}
	app, err := AppFromPath(args[1])
	if err != nil {
		fatal(sess, err.Error())
		return
	}
	log := s.log.With("app", app, "user", user.Name, "key", user.KeyName, "fingerprint", fp)
	if args[0] == "git-upload-pack" {
		s.uploadPack(ctx, sess, user, app, log)
		return
	}
	code := s.receivePack(ctx, sess, user, app, log)
	_ = sess.Exit(code)
}

// AppFromPath maps a repository path to an app name: "myapp", "/myapp", "myapp.git"
// and "/myapp.git/" all name myapp. Anything else is an error that says what an app
// name is; no path can name a directory outside the repositories.
func AppFromPath(p string) (string, error) {
	name := strings.TrimPrefix(p, "~/")
	name = strings.TrimPrefix(name, "/")
	name = strings.TrimSuffix(name, "/")
	name = strings.TrimSuffix(name, ".git")
	if !appv1.ValidAppName(name) {
		return "", fmt.Errorf("%q is not an app: an app name is %s (git remote add bex ssh://git@HOST:PORT/myapp)", p, appv1.AppNameRule)
	}
	return name, nil
}

// fatal tells git why it cannot go on, as a pkt-line ERR (git prints
// "fatal: remote error: <msg>"), and ends the session with status 1.
func fatal(sess ssh.Session, msg string) {
	line := "ERR " + msg + "\n"
	fmt.Fprintf(sess, "%04x%s", len(line)+4, line)
	_ = sess.Exit(1)
}
