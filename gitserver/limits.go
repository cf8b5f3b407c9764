package gitserver

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// The SSH port is public, so what a client may hold before it has proven a key is
// bounded: connections not yet authenticated are counted per source address and in
// total (from accept until a signature verifies), and each has HandshakeTimeout from
// accept to authenticate. After that, the sessions of a connection and the env
// requests of a session are bounded too, so that one key cannot make the server hold
// unbounded goroutines or memory on one TCP connection.

// unauthLimiter counts the connections that have not authenticated yet.
type unauthLimiter struct {
	perSource, total int

	mu     sync.Mutex
	bySrc  map[string]int
	inFlow int
}

// acquire takes a slot for a connection from src; false when src or the total is
// at its cap. The returned func gives the slot back, once however often called.
func (l *unauthLimiter) acquire(src string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySrc == nil {
		l.bySrc = map[string]int{}
	}
	if l.inFlow >= l.total || l.bySrc[src] >= l.perSource {
		return nil, false
	}
	l.inFlow++
	l.bySrc[src]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.inFlow--
			if l.bySrc[src]--; l.bySrc[src] <= 0 {
				delete(l.bySrc, src)
			}
		})
	}, true
}

// sourceOf is the address a connection is counted under: its IP, without the port.
func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// pendingConn is a connection until it authenticates: reads and writes cannot go
// past the handshake deadline (gliderlabs/ssh sets the idle deadline before every
// read and write, so the deadline is applied to each of its calls rather than set
// once), and closing it gives back its unauthenticated slot.
type pendingConn struct {
	net.Conn
	release func()

	mu            sync.Mutex
	authenticated bool
	deadline      time.Time // the handshake's end
	idle          time.Duration
}

func (c *pendingConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.authenticated && (t.IsZero() || t.After(c.deadline)) {
		t = c.deadline
	}
	return c.Conn.SetDeadline(t)
}

func (c *pendingConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.authenticated && (t.IsZero() || t.After(c.deadline)) {
		t = c.deadline
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *pendingConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.authenticated && (t.IsZero() || t.After(c.deadline)) {
		t = c.deadline
	}
	return c.Conn.SetWriteDeadline(t)
}

// authenticate ends the handshake's bounds: the slot is given back and the deadline
// becomes the idle timeout again. The read already waiting (the transport's read
// loop) gets the new deadline too.
func (c *pendingConn) authenticate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.authenticated {
		return
	}
	c.authenticated = true
	c.release()
	var t time.Time
	if c.idle > 0 {
		t = time.Now().Add(c.idle)
	}
	_ = c.Conn.SetDeadline(t)
}

func (c *pendingConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// connCallback admits a new connection under the unauthenticated caps (nil closes
// it at once) and gives it the handshake deadline.
func (s *Server) connCallback(ctx ssh.Context, conn net.Conn) net.Conn {
	src := sourceOf(conn.RemoteAddr())
	release, ok := s.unauth.acquire(src)
	if !ok {
		s.metrics.refused.WithLabelValues("unauthenticated").Inc()
		// Debug: a flood of these must not become a flood of log lines.
		s.log.Debug("connection refused: too many unauthenticated connections", "remote", conn.RemoteAddr().String(),
			"per_source", s.cfg.MaxUnauthPerSource, "total", s.cfg.MaxUnauthConns)
		return nil
	}
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	_ = conn.SetDeadline(deadline)
	p := &pendingConn{Conn: withQuickAck(conn), release: release, deadline: deadline, idle: s.cfg.IdleTimeout}
	ctx.SetValue(ctxPending, p)
	ctx.SetValue(ctxSessions, new(atomic.Int32))
	return p
}

// sessionChannel bounds the session channels open at once on a connection
// (Config.MaxSessionsPerConn) and hands the default session handler requests with
// the env requests bounded (Config.MaxEnvRequests, Config.MaxEnvBytes each).
func (s *Server) sessionChannel(srv *ssh.Server, conn *gossh.ServerConn, ch gossh.NewChannel, ctx ssh.Context) {
	n, _ := ctx.Value(ctxSessions).(*atomic.Int32)
	if n == nil {
		_ = ch.Reject(gossh.Prohibited, "no session here")
		return
	}
	if n.Add(1) > int32(s.cfg.MaxSessionsPerConn) {
		n.Add(-1)
		s.metrics.refused.WithLabelValues("sessions").Inc()
		s.log.Warn("session refused: too many on one connection", "remote", conn.RemoteAddr().String(), "max", s.cfg.MaxSessionsPerConn)
		_ = ch.Reject(gossh.ResourceShortage, "too many sessions on this connection")
		return
	}
	defer n.Add(-1)
	ssh.DefaultSessionHandler(srv, conn, &boundedEnv{NewChannel: ch, max: s.cfg.MaxEnvRequests, maxBytes: s.cfg.MaxEnvBytes,
		refused: s.metrics.refused.WithLabelValues("env").Inc}, ctx)
}

// boundedEnv is a NewChannel whose requests pass through a filter: past max env
// requests, or for one larger than maxBytes, the request is answered no and not
// handed on (gliderlabs/ssh would keep every one of them in the session).
type boundedEnv struct {
	gossh.NewChannel
	max, maxBytes int
	refused       func()
}

func (b *boundedEnv) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, in, err := b.NewChannel.Accept()
	if err != nil {
		return ch, in, err
	}
	out := make(chan *gossh.Request)
	go func() {
		defer close(out)
		envs := 0
		for req := range in {
			if req.Type == "env" {
				envs++
				if envs > b.max || len(req.Payload) > b.maxBytes {
					b.refused()
					if req.WantReply {
						_ = req.Reply(false, nil)
					}
					continue
				}
			}
			out <- req
		}
	}()
	return ch, out, nil
}
