package gitserver

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// The SSH port is public, so what a client may hold before it has proven a key is
// bounded: connections not yet authenticated are counted per source address and in
// total (from the slot's grant until a signature verifies), and each has
// HandshakeTimeout from its grant to authenticate. One past a cap waits for a slot
// in a bounded queue (per source and in total, each for at most UnauthQueueWait)
// rather than being dropped: twenty `ssh` commands at once from one CI job or one
// NAT are a burst to serve in turn, not an attack; a flood from one source still
// holds at most its slots and its place in the queue. After that, the sessions of a
// connection and the env requests of a session are bounded too, so that one key
// cannot make the server hold unbounded goroutines or memory on one TCP connection.

// unauthLimiter counts the connections that have not authenticated yet, and
// queues those past its caps.
type unauthLimiter struct {
	perSource, total int
	// queuedPerSource and queuedTotal bound the connections waiting for a slot.
	queuedPerSource, queuedTotal int

	mu       sync.Mutex
	bySrc    map[string]int
	inFlow   int
	queue    []*unauthWaiter // first come, first served among those a slot fits
	queuedBy map[string]int
	closed   bool
}

// unauthWaiter is a connection waiting for a slot: wake is closed when the
// limiter has given it one (granted, and counted already) or is closing.
type unauthWaiter struct {
	src     string
	wake    chan struct{}
	granted bool
}

// Why acquire gave no slot.
const (
	unauthFull    = "full"    // the caps and the queue are full: closed at once
	unauthTimeout = "timeout" // waited its whole UnauthQueueWait
	unauthClosed  = "closed"  // the server is shutting down
)

// fits reports whether a connection from src may take a slot now.
func (l *unauthLimiter) fits(src string) bool {
	return l.inFlow < l.total && l.bySrc[src] < l.perSource
}

// releaser is the func that gives src's slot back, once however often called.
func (l *unauthLimiter) releaser(src string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.give(src)
		})
	}
}

// give returns src's slot and hands slots to the waiters they now fit, first
// come first. l.mu is held.
func (l *unauthLimiter) give(src string) {
	l.inFlow--
	if l.bySrc[src]--; l.bySrc[src] <= 0 {
		delete(l.bySrc, src)
	}
	for i := 0; i < len(l.queue) && l.inFlow < l.total; {
		w := l.queue[i]
		if !l.fits(w.src) {
			i++
			continue
		}
		l.dequeue(i)
		l.inFlow++
		l.bySrc[w.src]++
		w.granted = true
		close(w.wake)
	}
}

func (l *unauthLimiter) dequeue(i int) {
	w := l.queue[i]
	l.queue = slices.Delete(l.queue, i, i+1)
	if l.queuedBy[w.src]--; l.queuedBy[w.src] <= 0 {
		delete(l.queuedBy, w.src)
	}
}

// acquire takes a slot for a connection from src, waiting up to wait in the
// queue when src or the total is at its cap and the queue has room. It returns
// the func that gives the slot back (once however often called), how long it
// waited, and, when it got none, why (unauthFull, unauthTimeout, unauthClosed).
func (l *unauthLimiter) acquire(src string, wait time.Duration) (release func(), waited time.Duration, refused string) {
	l.mu.Lock()
	if l.bySrc == nil {
		l.bySrc, l.queuedBy = map[string]int{}, map[string]int{}
	}
	if l.closed {
		l.mu.Unlock()
		return nil, 0, unauthClosed
	}
	// No waiter fits where a newcomer fits (give hands each freed slot to the
	// first waiter it fits), so a newcomer that fits jumps nobody.
	if l.fits(src) {
		l.inFlow++
		l.bySrc[src]++
		l.mu.Unlock()
		return l.releaser(src), 0, ""
	}
	if len(l.queue) >= l.queuedTotal || l.queuedBy[src] >= l.queuedPerSource {
		l.mu.Unlock()
		return nil, 0, unauthFull
	}
	w := &unauthWaiter{src: src, wake: make(chan struct{})}
	l.queue = append(l.queue, w)
	l.queuedBy[src]++
	l.mu.Unlock()

	start := time.Now()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-w.wake:
	case <-timer.C:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	waited = time.Since(start)
	switch {
	case w.granted && l.closed:
		l.give(src)
		return nil, waited, unauthClosed
	case w.granted: // perhaps just as the wait ended: the slot is counted
		return l.releaser(src), waited, ""
	case l.closed: // close took it out of the queue
		return nil, waited, unauthClosed
	}
	if i := slices.Index(l.queue, w); i >= 0 {
		l.dequeue(i)
	}
	return nil, waited, unauthTimeout
}

// close ends every wait (the server is shutting down) and refuses the
// connections that come after.
func (l *unauthLimiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, w := range l.queue {
		close(w.wake)
	}
	l.queue, l.queuedBy = nil, map[string]int{}
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

// connCallback admits a new connection under the unauthenticated caps, waiting
// in their queue when they are full (nil closes it) and gives it the handshake
// deadline, which runs from the grant: the wait is not the client's slowness.
// It runs on the connection's own goroutine (gliderlabs/ssh's HandleConn), so a
// wait holds up no other connection.
func (s *Server) connCallback(ctx ssh.Context, conn net.Conn) net.Conn {
	src := sourceOf(conn.RemoteAddr())
	release, waited, refused := s.unauth.acquire(src, s.cfg.UnauthQueueWait)
	if waited > 0 {
		s.metrics.unauthWaits.Observe(waited.Seconds())
	}
	if refused != "" {
		s.metrics.refused.WithLabelValues("unauthenticated").Inc()
		// Debug: a flood of these must not become a flood of log lines.
		s.log.Debug("connection refused: too many unauthenticated connections", "remote", conn.RemoteAddr().String(),
			"why", refused, "waited", waited, "per_source", s.cfg.MaxUnauthPerSource, "total", s.cfg.MaxUnauthConns,
			"queued_per_source", s.cfg.MaxUnauthQueuedPerSource, "queued", s.cfg.MaxUnauthQueued)
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
