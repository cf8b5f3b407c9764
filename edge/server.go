package edge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Server serves a Proxy on listeners. Most requests an app gets are a GET or a
// HEAD without a body over a kept-alive HTTP/1.1 connection; the Server's fast lane
// reads those itself, proxies them and writes the response on the connection's
// goroutine, without net/http's per-request machinery (a response writer, a
// background read per request to notice a client leaving, ReverseProxy's header
// copies), which costs as much CPU as the proxying itself (BenchmarkProxy).
//
// Everything else goes to net/http, untouched: the lane looks at a request's head
// without taking it off the connection, and when the request is anything but
// simple (a body, an upgrade, Expect, HTTP/1.0, a head over 4 KiB, a host that is
// not an app with a running instance, ...) it hands the connection, with the bytes
// it has read and not used, to an http.Server with the Proxy as its handler, which
// keeps the connection from then on. HTTP/2 connections (ALPN h2) are handed over
// before the first byte. So error pages, WebSockets, uploads and HTTP/2 are
// served exactly as by an http.Server alone.
//
// A client that closes its connection while the lane waits for the backend's
// response is noticed once the wait passes watchAfter (net/http watches from the
// first instant, at a cost to every request), and the request is abandoned (499).
type Server struct {
	proxy   *Proxy
	http    *http.Server
	handoff *handoffListener
	ctx     context.Context // canceled by Close: backend round trips give up
	cancel  context.CancelFunc

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*laneConn]struct{}
	lns     map[net.Listener]struct{}
	active  sync.WaitGroup // one per connection the lane holds
	serving sync.Once
}

// laneReadSize is the fast lane's read buffer: a request head must fit in it to
// take the lane; browsers' heads are well under 4 KiB, and larger ones go to
// net/http, which enforces MaxHeaderBytes.
const laneReadSize = 4 << 10

// NewServer returns a Server for p. tlsConfig is the configuration of the TLS
// listeners it will serve (nil if none): net/http reads it to offer HTTP/2.
func (p *Proxy) NewServer(tlsConfig *tls.Config) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		proxy:   p,
		handoff: newHandoffListener(),
		ctx:     ctx,
		cancel:  cancel,
		conns:   map[*laneConn]struct{}{},
		lns:     map[net.Listener]struct{}{},
	}
	s.http = &http.Server{
		Handler:   p,
		TLSConfig: tlsConfig,
		// A handed-over TLS connection reaches net/http wrapped (it replays what the
		// lane read), so net/http does not see its TLS state: the Proxy finds it here.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if rc, ok := c.(*replayConn); ok {
				if tc, ok := rc.Conn.(*tls.Conn); ok {
					cs := tc.ConnectionState()
					return context.WithValue(ctx, tlsStateKey{}, &cs)
				}
			}
			return ctx
		},
	}
	p.ConfigureServer(s.http)
	return s
}

// Serve accepts connections on l until Shutdown or Close, and returns
// http.ErrServerClosed then. l may be a TLS listener (tls.NewListener).
func (s *Server) Serve(l net.Listener) error {
	// The http.Server's Serve ends when Shutdown or Close closes the handoff
	// listener; it has nothing else to report.
	s.serving.Do(func() { go s.http.Serve(s.handoff) })
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.lns[l] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			// Out of file descriptors and the like: wait and go on, as net/http does.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.proxy.log.Warn("edge: accept failed, retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		lc := &laneConn{Conn: c}
		lc.ctx = &laneCtx{Context: httptrace.WithClientTrace(s.ctx, informationalTo(lc))}
		if !s.track(lc) {
			c.Close()
			return http.ErrServerClosed
		}
		go s.serveConn(lc)
	}
}

// Shutdown stops accepting, closes idle connections, and waits until the
// requests in flight have been answered (their connections close after them) or
// ctx ends, whichever comes first; then it closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopAccepting()
	errc := make(chan error, 1)
	go func() { errc <- s.http.Shutdown(ctx) }()
	s.mu.Lock()
	for lc := range s.conns {
		lc.wakeIfIdle()
	}
	s.mu.Unlock()
	lanes := make(chan struct{})
	go func() { s.active.Wait(); close(lanes) }()
	var err error
	select {
	case <-lanes:
	case <-ctx.Done():
		err = ctx.Err()
		s.closeConns()
	}
	return errors.Join(err, <-errc)
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.stopAccepting()
	s.cancel()
	s.closeConns()
	return s.http.Close()
}

func (s *Server) stopAccepting() {
	s.closing.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range s.lns {
		l.Close()
	}
	clear(s.lns)
	s.handoff.Close()
}

func (s *Server) closeConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for lc := range s.conns {
		lc.Close()
		lc.ctx.in.interrupt() // a round trip in progress ends now
	}
}

func (s *Server) track(lc *laneConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[lc] = struct{}{}
	s.active.Add(1)
	s.proxy.m.connections.Inc()
	return true
}

// release forgets lc: the lane closed it or handed it over. Only the first call
// counts.
func (s *Server) release(lc *laneConn) {
	if !lc.released.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	delete(s.conns, lc)
	s.mu.Unlock()
	s.proxy.m.connections.Dec()
	s.active.Done()
}

// laneConn is a client connection the fast lane holds.
type laneConn struct {
	net.Conn
	idle     atomic.Bool // waiting for the first byte of a request: Shutdown may close it
	released atomic.Bool // see Server.release
	remote   string      // RemoteAddr, formatted once (the client a trusted proxy's PROXY header named)
	clientIP string      // its host: the peer that clientIP starts from
	watch    *clientWatch
	ctx      *laneCtx
	bw       *bufio.Writer
}

// wakeIfIdle makes an idle connection's pending read fail now, so that its
// goroutine sees the shutdown and closes it. A request that arrived meanwhile
// is still served: reading its head sets a new deadline.
func (lc *laneConn) wakeIfIdle() {
	if lc.idle.Load() {
		lc.SetReadDeadline(time.Unix(1, 0))
	}
}

var (
	laneReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, laneReadSize) }}
	laneWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// errHandOver: the request is not the lane's; net/http takes the connection.
var errHandOver = errors.New("not a fast-lane request")

func (s *Server) serveConn(lc *laneConn) {
	// Here, not in Serve's loop: behind Proxy.ProxyProtocol, RemoteAddr waits
	// for the PROXY header, and Accept must not wait for one client.
	lc.remote = lc.RemoteAddr().String()
	lc.clientIP, _, _ = net.SplitHostPort(lc.remote)
	// A panic serving one connection ends that connection, not the edge, as in
	// net/http.
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				s.proxy.log.Error("edge: panic serving a connection", "client", lc.remote, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
			lc.Close()
			s.release(lc)
		}
	}()
	cfg := s.proxy.cfg
	if tc, ok := lc.Conn.(*tls.Conn); ok {
		tc.SetDeadline(time.Now().Add(cfg.ReadHeaderTimeout))
		if err := tc.HandshakeContext(s.ctx); err != nil {
			s.proxy.log.Debug("edge: TLS handshake failed", "client", lc.remote, "err", err)
			lc.Close()
			s.release(lc)
			return
		}
		tc.SetDeadline(time.Time{})
		if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
			s.handOver(lc, nil) // HTTP/2, or an ACME TLS-ALPN-01 check
			return
		}
	}
	_, https := lc.Conn.(*tls.Conn)
	br := laneReaders.Get().(*bufio.Reader)
	br.Reset(lc)
	bw := laneWriters.Get().(*bufio.Writer)
	bw.Reset(lc)
	lc.bw = bw
	lc.watch = newClientWatch(lc, br, lc.ctx.in.interrupt)
	defer func() {
		br.Reset(nil)
		laneReaders.Put(br)
		bw.Reset(nil)
		laneWriters.Put(bw)
	}()
	for first := true; ; first = false {
		head, err := s.readHead(lc, br, first)
		if err == nil {
			var req *http.Request
			var route Route
			if req, route, err = parseHead(s.proxy, head); err == nil {
				br.Discard(len(head))
				if s.proxy.serveLane(lc, https, bw, req, route) && !s.closing.Load() {
					continue
				}
				lc.Close()
				s.release(lc)
				return
			}
		}
		if errors.Is(err, errHandOver) {
			s.handOver(lc, br)
			return
		}
		lc.Close() // the client left, went quiet, or sent half a request
		s.release(lc)
		return
	}
}

// readHead waits for a request and returns its head (request line and headers,
// through the blank line) from br's buffer without consuming it.
func (s *Server) readHead(lc *laneConn, br *bufio.Reader, first bool) ([]byte, error) {
	cfg := s.proxy.cfg
	if br.Buffered() == 0 {
		wait := cfg.ClientIdleTimeout
		if first {
			wait = cfg.ReadHeaderTimeout
		}
		lc.idle.Store(true)
		if s.closing.Load() {
			return nil, http.ErrServerClosed
		}
		lc.SetReadDeadline(time.Now().Add(wait))
		_, err := br.Peek(1)
		lc.idle.Store(false)
		if err != nil {
			return nil, err
		}
	}
	lc.SetReadDeadline(time.Now().Add(cfg.ReadHeaderTimeout))
	for {
		buf, _ := br.Peek(br.Buffered())
		if i := bytes.Index(buf, crlfcrlf); i >= 0 {
			if i+4 > cfg.MaxHeaderBytes || bytes.Contains(buf[:i], lflf) {
				return nil, errHandOver // net/http answers 431, or reads bare LFs its own way
			}
			return buf[:i+4], nil
		}
		if len(buf) == br.Size() || bytes.Contains(buf, lflf) {
			return nil, errHandOver
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
)

// handOver gives lc to the http.Server, with what br holds unread.
func (s *Server) handOver(lc *laneConn, br *bufio.Reader) {
	lc.SetDeadline(time.Time{})
	var c net.Conn = lc.Conn
	if br != nil && br.Buffered() > 0 {
		pending, _ := br.Peek(br.Buffered())
		c = &replayConn{Conn: lc.Conn, pending: bytes.Clone(pending)}
	}
	s.release(lc)
	s.proxy.m.handoffs.Inc()
	if !s.handoff.give(c) {
		c.Close()
	}
}

// replayConn is a connection whose first bytes were already read (by the lane):
// Read returns those first.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite lets net/http half-close the connection before it hangs up on a
// request it refused (431, say), so that the client reads the answer instead of
// a reset; it looks for this method on the connection.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// handoffListener is the http.Server's listener: its connections come from the
// lane.
type handoffListener struct {
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return handoffAddr{} }

type handoffAddr struct{}

func (handoffAddr) Network() string { return "edge" }
func (handoffAddr) String() string  { return "edge fast lane" }

// headParser parses request heads with net/http's own parser, from a reader
// over the head's bytes. They are pooled: one is needed only for the moment of a
// parse, not for a connection's life.
type headParser struct {
	src bytes.Reader
	br  *bufio.Reader
}

var headParsers = sync.Pool{New: func() any {
	hp := &headParser{}
	hp.br = bufio.NewReaderSize(&hp.src, laneReadSize)
	return hp
}}

// parseHead parses head and returns the request and its route if the lane can
// serve it whole, or errHandOver. The request keeps nothing of the parser's
// buffer: its fields are copies, and a request with a body is not the lane's.
func parseHead(p *Proxy, head []byte) (*http.Request, Route, error) {
	hp := headParsers.Get().(*headParser)
	hp.src.Reset(head)
	hp.br.Reset(&hp.src)
	req, err := http.ReadRequest(hp.br)
	whole := hp.br.Buffered() == 0 && hp.src.Len() == 0
	hp.src.Reset(nil)
	headParsers.Put(hp)
	if err != nil || !whole || !laneRequest(req) {
		return nil, Route{}, errHandOver
	}
	if !p.table.Ready() {
		return nil, Route{}, errHandOver
	}
	route, ok := p.table.Lookup(hostOnly(req.Host))
	if !ok || route.Platform || route.Suspended || len(route.Backends) == 0 {
		return nil, Route{}, errHandOver // an error page, or bex's own endpoints: net/http's
	}
	return req, route, nil
}

// laneRequest reports whether req is what the lane serves: an HTTP/1.1 GET or
// HEAD in origin form, with a valid Host and headers, no body of any kind, no
// upgrade or expectation, and nothing in Connection but keep-alive. Anything
// else, including what net/http would refuse with 400, is net/http's to answer.
func laneRequest(req *http.Request) bool {
	if req.ProtoMajor != 1 || req.ProtoMinor != 1 ||
		(req.Method != http.MethodGet && req.Method != http.MethodHead) ||
		req.ContentLength != 0 || len(req.TransferEncoding) != 0 ||
		len(req.RequestURI) == 0 || req.RequestURI[0] != '/' ||
		req.Host == "" || !httpguts.ValidHostHeader(req.Host) || !cleanQuery(req.URL.RawQuery) {
		return false
	}
	for k, vv := range req.Header {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Upgrade", "Expect", "Trailer", "Te", "Keep-Alive", "Proxy-Connection":
			return false
		case "Connection":
			if len(vv) != 1 || !asciiEqualFold(vv[0], "keep-alive") {
				return false
			}
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// cleanQuery reports whether ReverseProxy would pass raw through as it is: it
// re-encodes a query with a semicolon, a malformed escape, or over 1000 parameters.
func cleanQuery(raw string) bool {
	params := 1
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case ';':
			return false
		case '&':
			if params++; params > 1000 {
				return false
			}
		case '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		ca, cb := a[i], b[i]
		if 'A' <= ca && ca <= 'Z' {
			ca += 'a' - 'A'
		}
		if ca != cb {
			return false
		}
	}
	return true
}
