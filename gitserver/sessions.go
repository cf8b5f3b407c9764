package gitserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// sessions are the open sessions by the key that authenticated them. A key is
// checked at connection time only; removing it from its User must also end what it
// already opened (a `logs -f` left running, a long push), so the sessions are looked
// up again every Config.SessionRecheck and those whose key no longer belongs to the
// same user are closed.
type sessions struct {
	mu   sync.Mutex
	open map[*openSession]struct{}
}

type openSession struct {
	key    gossh.PublicKey
	user   string
	stderr io.Writer
	close  func() error
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

// recheckSessions runs until ctx ends, closing every session whose key the
// Directory no longer maps to the user the session started as. One lookup per key,
// from the Directory's cache: cheap enough to run every second or two.
func (s *Server) recheckSessions(ctx context.Context) {
	t := time.NewTicker(s.cfg.SessionRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
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
				if err == nil && u.Name == o.user {
					continue
				}
				s.log.Info("closing session: its key was removed", "user", o.user, "fingerprint", fp)
				fmt.Fprintf(o.stderr, "\nbex: key %s no longer belongs to %s: closing this session\n", fp, o.user)
				_ = o.close()
			}
		}
	}
}
