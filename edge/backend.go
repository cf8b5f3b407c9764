package edge

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// backendTransport is the edge's HTTP/1.1 client for the common request: no body,
// no upgrade, an idempotent method. It writes the request and reads the response
// on the caller's goroutine over a pooled kept-alive connection. net/http's
// Transport hands every request to a writer goroutine and every response back from
// a reader goroutine; on a small response those hand-offs cost about as much as
// the proxying itself (profiled with BenchmarkProxy). Every other request (bodies,
// WebSockets and other upgrades, POST) goes to fallback, net/http's Transport.
//
// What it keeps from net/http's Transport: the dial timeout, the response header
// timeout (a timeout error, so 504), the response header size limit, idle
// connections per backend with an idle timeout, 1xx responses passed to
// httptrace (ReverseProxy forwards them), and one retry on a fresh connection
// when a reused one turns out to have been closed by the backend while idle.
type backendTransport struct {
	cfg      Config
	dialer   net.Dialer
	fallback http.RoundTripper

	mu      sync.Mutex
	idle    map[string][]*backendConn // by host:port, most recently used last
	sweeper *time.Timer               // closes idle connections past IdleConnTimeout
}

func newBackendTransport(cfg Config, fallback http.RoundTripper) *backendTransport {
	return &backendTransport{
		cfg:      cfg,
		dialer:   net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second},
		fallback: fallback,
		idle:     map[string][]*backendConn{},
	}
}

// backendConn is one kept-alive connection to a backend.
type backendConn struct {
	net.Conn
	addr   string
	br     *bufio.Reader
	bw     *bufio.Writer
	limit  int64 // bytes the header read may still take from the connection; <0: no limit
	idleAt time.Time
}

// errHeadersTooLarge is a backend's response headers over MaxHeaderBytes.
var errHeadersTooLarge = errors.New("response headers exceed the edge's max header bytes")

func (c *backendConn) Read(p []byte) (int, error) {
	if c.limit >= 0 {
		if c.limit == 0 {
			return 0, errHeadersTooLarge
		}
		if int64(len(p)) > c.limit {
			p = p[:c.limit]
		}
		n, err := c.Conn.Read(p)
		c.limit -= int64(n)
		return n, err
	}
	return c.Conn.Read(p)
}

// simple reports whether req can take the short path.
func simple(req *http.Request) bool {
	return retriable(req) && req.Header.Get("Upgrade") == "" && req.URL.Scheme == "http"
}

func (t *backendTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !simple(req) {
		return t.fallback.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := t.get(req.Context(), req.URL.Host)
		if err != nil {
			return nil, err
		}
		res, err := t.roundTrip(c, req)
		if err == nil {
			return res, nil
		}
		c.Close()
		// A backend closes idle connections when it likes; the request, idempotent
		// and without a body, goes again on a new connection.
		if reused && attempt == 0 && req.Context().Err() == nil && closedByPeer(err) {
			continue
		}
		return nil, err
	}
}

func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (t *backendTransport) roundTrip(c *backendConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	// A client that leaves unblocks whatever waits on the backend: the deadline
	// fails the read or write, and the connection is not reused. The fast lane
	// says so through its interrupter (no per-request context to cancel);
	// net/http's requests through their context.
	var stop func() bool
	if in, ok := ctx.Value(interrupterKey{}).(*interrupter); ok {
		in.attach(c.Conn)
		stop = in.detach
	} else {
		stop = context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	}
	fail := func(err error) (*http.Response, error) {
		stop()
		return nil, err
	}
	if err := writeRequest(c.bw, req); err != nil {
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		return fail(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(t.cfg.ResponseHeaderTimeout)); err != nil {
		return fail(err)
	}
	c.limit = int64(t.cfg.MaxHeaderBytes)
	var res *http.Response
	for informational := 0; ; informational++ {
		var err error
		if res, err = http.ReadResponse(c.br, req); err != nil {
			return fail(err)
		}
		if res.StatusCode >= 200 || informational >= 5 {
			break
		}
		if res.StatusCode == http.StatusSwitchingProtocols {
			return fail(errors.New("the backend switched protocols without being asked"))
		}
		if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(res.StatusCode, textproto.MIMEHeader(res.Header)); err != nil {
				return fail(err)
			}
		}
	}
	if res.StatusCode < 200 {
		return fail(fmt.Errorf("the backend sent %d informational responses and no final one", 5))
	}
	c.limit = -1
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	res.Body = &backendBody{rc: res.Body, c: c, t: t, stop: stop, keep: !res.Close && !req.Close}
	return res, nil
}

// backendBody returns its connection to the pool once the body has been read to
// the end, and closes it when the body is closed before that: reading the rest of
// a large or endless body only to reuse a connection is not worth it.
type backendBody struct {
	rc   io.ReadCloser
	c    *backendConn
	t    *backendTransport
	stop func() bool
	keep bool
	done bool
}

func (b *backendBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish(err == io.EOF)
	}
	return n, err
}

func (b *backendBody) Close() error {
	if !b.done {
		b.finish(false) // not rc.Close: it would read the rest of the body
	}
	return nil
}

func (b *backendBody) finish(eof bool) {
	b.done = true
	// stop is false when the client left: the deadline is already set.
	if b.stop() && eof && b.keep && b.c.br.Buffered() == 0 {
		b.t.put(b.c)
		return
	}
	b.c.Close()
}

// get returns an idle connection to addr, or dials one.
func (t *backendTransport) get(ctx context.Context, addr string) (c *backendConn, reused bool, err error) {
	t.mu.Lock()
	for conns := t.idle[addr]; len(conns) > 0; conns = t.idle[addr] {
		c = conns[len(conns)-1]
		conns[len(conns)-1] = nil
		t.idle[addr] = conns[:len(conns)-1]
		if time.Since(c.idleAt) < t.cfg.IdleConnTimeout {
			t.mu.Unlock()
			return c, true, nil
		}
		c.Close()
	}
	t.mu.Unlock()
	nc, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	c = &backendConn{Conn: nc, addr: addr, limit: -1}
	c.br = bufio.NewReader(c)
	c.bw = bufio.NewWriter(nc)
	return c, false, nil
}

// put keeps c for the next request to its backend, unless the pool is full.
func (t *backendTransport) put(c *backendConn) {
	c.idleAt = time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.idle[c.addr]) >= t.cfg.MaxIdleConnsPerHost {
		c.Close()
		return
	}
	t.idle[c.addr] = append(t.idle[c.addr], c)
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(t.cfg.IdleConnTimeout, t.sweep)
	}
}

// sweep closes the connections that stayed idle past IdleConnTimeout, and comes
// back while any idle connection is left.
func (t *backendTransport) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr, conns := range t.idle {
		kept := conns[:0]
		for _, c := range conns {
			if time.Since(c.idleAt) >= t.cfg.IdleConnTimeout {
				c.Close()
			} else {
				kept = append(kept, c)
			}
		}
		clear(conns[len(kept):])
		if len(kept) == 0 {
			delete(t.idle, addr)
		} else {
			t.idle[addr] = kept
		}
	}
	if len(t.idle) > 0 {
		t.sweeper.Reset(t.cfg.IdleConnTimeout / 2)
	} else {
		t.sweeper = nil
	}
}

// writeRequest writes req, which has no body, to w. A GET or HEAD whose host and
// header values are plain (which net/http's server and the fast lane have
// checked before a request gets here) is written directly, as Request.Write
// would write it but without its per-request allocations (a transfer writer, a
// sorted copy of the headers); anything else goes through Request.Write.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	ua, haveUA := req.Header["User-Agent"]
	if (req.Method != http.MethodGet && req.Method != http.MethodHead) || req.Close ||
		req.URL.Opaque != "" || !httpguts.ValidHostHeader(host) || (haveUA && len(ua) != 1) || !plainHeader(req.Header) {
		return req.Write(w)
	}
	w.WriteString(req.Method)
	w.WriteByte(' ')
	w.WriteString(req.URL.RequestURI())
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	w.WriteString("\r\n")
	switch {
	case !haveUA:
		w.WriteString("User-Agent: Go-http-client/1.1\r\n") // as Request.Write
	case ua[0] != "":
		w.WriteString("User-Agent: ")
		w.WriteString(ua[0])
		w.WriteString("\r\n")
	}
	for k, vv := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		for _, v := range vv {
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(v)
			w.WriteString("\r\n")
		}
	}
	_, err := w.WriteString("\r\n")
	return err
}

// plainHeader reports whether every header name and value can be written as it
// is: a valid field name, and a value without control characters (so no line
// breaks) and without the spaces at its ends that Request.Write would trim.
func plainHeader(h http.Header) bool {
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) || (v != "" && (v[0] == ' ' || v[0] == '\t' ||
				v[len(v)-1] == ' ' || v[len(v)-1] == '\t')) {
				return false
			}
		}
	}
	return true
}

// interrupterKey is the context key of an *interrupter.
type interrupterKey struct{}

// interrupter cuts a backend round trip short from another goroutine: the fast
// lane's client watch uses it when the client leaves. One serves the round trips
// of one client connection, one after the other, and costs nothing per request,
// where a cancelable context per request would cost a context and its
// registration with its parent.
type interrupter struct {
	mu          sync.Mutex
	conn        net.Conn // the backend connection in use, if any
	interrupted bool
}

func (in *interrupter) attach(c net.Conn) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.conn = c
	if in.interrupted {
		c.SetDeadline(time.Unix(1, 0))
	}
}

// detach reports false if the round trip was interrupted.
func (in *interrupter) detach() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.conn = nil
	return !in.interrupted
}

// interrupt fails the round trip in progress, and the next one if none is.
func (in *interrupter) interrupt() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.interrupted = true
	if in.conn != nil {
		in.conn.SetDeadline(time.Unix(1, 0))
	}
}

// wasInterrupted reports whether interrupt was called since the last reset.
func (in *interrupter) wasInterrupted() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.interrupted
}

// reset makes the interrupter ready for the next round trip.
func (in *interrupter) reset() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.interrupted = false
}
