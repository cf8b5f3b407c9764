package gitserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// sessions are the open sessions by the key that authenticated them. A key, a
// role and an app's members are checked when a session starts; taking any of them
// away must also end what the session already does (a `logs -f` left running, a
// push waiting for the app's lock, a long build), so the open sessions are checked
// again every Config.SessionRecheck: a session whose key no longer belongs to the
// same user is closed, and one whose user (as read again) may no longer use an app
// or a database it works on is ended with a line saying why.
type sessions struct {
	mu   sync.Mutex
	open map[*openSession]struct{}
}

// endGrace is how long an ended session's handler gets to return (its context
// is cancelled, so the command or push stops) before the channel is closed under
// it: a push reading a pack from the client does not look at its context.
const endGrace = 500 * time.Millisecond

type openSession struct {
	key gossh.PublicKey
	// user is who the session started as; uses the apps it works on (a git
	// session's from the start, a command's as the backend reads them) and the
	// databases (as the backend reads them).
	user   *backend.User
	uses   *backend.Uses
	stderr io.Writer
	// end cancels the session's context; closeChannel closes its channel;
	// closeConn its whole connection.
	end          context.CancelCauseFunc
	closeChannel func() error
	closeConn    func() error
	// done is closed when the session's handler returns.
	done  chan struct{}
	ended bool // under sessions.mu: the line was written once
}

// add registers a session; the returned func removes it.
func (ss *sessions) add(o *openSession) func() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.open == nil {
		ss.open = map[*openSession]struct{}{}
	}
	ss.open[o] = struct{}{}
	return func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		delete(ss.open, o)
	}
}

// byKey groups the open sessions by key fingerprint.
func (ss *sessions) byKey() map[string][]*openSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	m := map[string][]*openSession{}
	for o := range ss.open {
		fp := gossh.FingerprintSHA256(o.key)
		m[fp] = append(m[fp], o)
	}
	return m
}

// markEnded reports whether o was still running, marking it ended.
func (ss *sessions) markEnded(o *openSession) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if o.ended {
		return false
	}
	o.ended = true
	return true
}

// track registers sess, authenticated as user, for the rechecks. It returns the
// context the session's work runs with (cancelled when the session is ended,
// carrying the backend.Uses that records the apps and databases it works on)
// and the func to call when the handler returns.
func (s *Server) track(sess ssh.Session, user *backend.User, key gossh.PublicKey) (context.Context, func()) {
	ctx, end := context.WithCancelCause(sess.Context())
	conn, _ := sess.Context().Value(ssh.ContextKeyConn).(gossh.Conn)
	o := &openSession{key: key, user: user, uses: &backend.Uses{}, stderr: sess.Stderr(),
		end: end, closeChannel: sess.Close, done: make(chan struct{}),
		closeConn: func() error {
			if conn != nil {
				return conn.Close()
			}
			return sess.Close()
		}}
	remove := s.sessions.add(o)
	return backend.WithUses(ctx, o.uses), func() {
		remove()
		close(o.done)
		end(nil)
	}
}

// recheckSessions runs until ctx ends, checking every open session again: one
// user lookup per key, one app read per app and one database read per database
// a session works on, all from the cache (the Directory's, the backend's), so
// that it is cheap enough to run every second.
func (s *Server) recheckSessions(ctx context.Context) {
	t := time.NewTicker(s.cfg.SessionRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.recheckOnce(ctx)
	}
}

func (s *Server) recheckOnce(ctx context.Context) {
	apps := map[string]*pipeline.App{}  // one read per app per round
	dbs := map[string]*appv1.Database{} // and per database
	for fp, list := range s.sessions.byKey() {
		lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
		u, err := s.dir.UserByKey(lookup, list[0].key)
		cancel()
		if err != nil && !errors.Is(err, ErrUnknownKey) {
			// The Directory cannot answer (the API cache is down): keep the
			// sessions rather than cut everyone off on a transient failure.
			s.log.Warn("session recheck failed", "fingerprint", fp, "err", err)
			continue
		}
		for _, o := range list {
			if err != nil || u.Name != o.user.Name {
				if o.uses.OwnKeyRemoved() {
					// keys:remove of its own key: it ends as its command
					// does, having said what it did.
					continue
				}
				if s.sessions.markEnded(o) {
					s.log.Info("closing session: its key was removed", "user", o.user.Name, "fingerprint", fp)
					fmt.Fprintf(o.stderr, "\nbex: key %s no longer belongs to %s: closing this session\n", fp, o.user.Name)
					_ = o.closeConn()
				}
				continue
			}
			if why := s.stillMayUse(ctx, o, u, apps, dbs); why != nil {
				s.endSession(o, why)
			}
		}
	}
}

// databaseReader reads a database as the cache has it now (nil: gone), for the
// rechecks: the backend, which New gets as the Admission, is one.
type databaseReader interface {
	CachedDatabase(ctx context.Context, name string) (*appv1.Database, error)
}

// stillMayUse applies the backend's rule (backend.StillMayUse) to the user as
// read again and each app and database the session works on, as the cache has
// it now.
func (s *Server) stillMayUse(ctx context.Context, o *openSession, now *backend.User, apps map[string]*pipeline.App, dbs map[string]*appv1.Database) error {
	for _, name := range o.uses.Apps() {
		a, ok := apps[name]
		if !ok {
			lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			a, err = s.dir.App(lookup, name)
			cancel()
			if err != nil && !errors.Is(err, pipeline.ErrAppNotFound) {
				s.log.Warn("session recheck failed", "app", name, "err", err)
				continue
			}
			apps[name] = a // nil: gone, nothing left to use (a push creating it has not yet)
		}
		if a == nil {
			continue
		}
		if err := backend.StillMayUse(o.user, now, name, a.Members); err != nil {
			return err
		}
	}
	used := o.uses.Databases()
	if len(used) == 0 {
		return nil
	}
	r, ok := s.admit.(databaseReader)
	if !ok {
		s.log.Warn("session recheck failed: this server cannot read databases", "user", o.user.Name, "databases", used)
		return nil
	}
	for _, name := range used {
		db, ok := dbs[name]
		if !ok {
			lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			db, err = r.CachedDatabase(lookup, name)
			cancel()
			if err != nil {
				s.log.Warn("session recheck failed", "database", name, "err", err)
				continue
			}
			dbs[name] = db // nil: gone, nothing left to use
		}
		if db == nil {
			continue
		}
		if err := backend.StillMayUseDatabase(o.user, now, name, db.Spec.Members); err != nil {
			return err
		}
	}
	return nil
}

// endSession ends o, which may no longer go on, saying why on its stderr: its
// context is cancelled, and its channel closed if its handler has not returned
// within endGrace.
func (s *Server) endSession(o *openSession, why error) {
	if !s.sessions.markEnded(o) {
		return
	}
	s.log.Info("ending session: access withdrawn", "user", o.user.Name, "fingerprint", o.user.KeyFingerprint, "reason", why.Error())
	fmt.Fprintf(o.stderr, "bex: %s\n", why.Error())
	o.end(why)
	go func() {
		select {
		case <-o.done:
		case <-time.After(endGrace):
			_ = o.closeChannel()
		}
	}()
}
