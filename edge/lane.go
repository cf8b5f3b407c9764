package edge

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"bex.co/bex/internal/clientaddr"
)

// serveLane proxies a request that the fast lane parsed and routed (see Server),
// and writes the response to bw: what ReverseProxy with Proxy.rewrite and the
// http.Server would have sent for it. It reports whether the connection can carry
// the client's next request.
func (p *Proxy) serveLane(lc *laneConn, https bool, bw *bufio.Writer, req *http.Request, route Route) bool {
	start := time.Now()
	st := &reqState{id: requestID(req.Header.Get(HeaderRequestID)), route: route}
	st.pick = route.next.Add(1) - 1
	method, host, path := req.Method, hostOnly(req.Host), req.URL.Path
	wantsHTML := strings.Contains(req.Header.Get("Accept"), "text/html")
	var status int
	var out int64
	p.m.inFlight.Inc()
	defer func() {
		p.m.inFlight.Dec()
		if st.status != 0 {
			status = st.status
		}
		p.observe(st, method, host, path, status, start, 0, out)
	}()

	// The request as Rewrite makes it: hop-by-hop headers out (the lane took only a
	// Connection of keep-alive and none of the others), X-Forwarded-* of the edge's
	// own, the client's Host kept, no Go User-Agent added.
	h := req.Header
	delete(h, "Connection")
	setClientAddr(h, clientaddr.Trusted(p.cfg.TrustedProxies).Client(lc.clientIP, h["X-Forwarded-For"]))
	h["X-Forwarded-Host"] = []string{req.Host}
	if https {
		h["X-Forwarded-Proto"] = []string{"https"}
	} else {
		h["X-Forwarded-Proto"] = []string{"http"}
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""}
	}
	h[HeaderRequestID] = []string{st.id}
	b := route.Backends[st.pick%uint64(len(route.Backends))]
	st.backend.Store(&b)
	req.URL.Scheme, req.URL.Host = "http", b
	req.RequestURI = ""
	req.RemoteAddr = lc.remote

	ctx := lc.ctx
	ctx.st = st
	ctx.in.reset()
	lc.watch.start()
	res, err := p.rp.Transport.RoundTrip(req.WithContext(ctx))
	lc.watch.stop()
	gone := ctx.in.wasInterrupted() || ctx.Err() != nil
	if err == nil && gone {
		// The client left just as the response came: nobody to send it to.
		res.Body.Close()
		err = context.Canceled
	}
	if err != nil {
		hdr := http.Header{}
		code, body, ok := p.errorPage(hdr, st, wantsHTML, err, gone)
		if !ok {
			return false
		}
		status = code
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
		hdr.Set("Date", time.Now().UTC().Format(http.TimeFormat)) // as the http.Server adds it
		if method == http.MethodHead {
			body = nil
		}
		writeHead(bw, code, hdr)
		bw.Write(body)
		out = int64(len(body))
		return bw.Flush() == nil
	}
	st.upstream, status = res.StatusCode, res.StatusCode
	var backendErr error
	out, backendErr, err = writeLaneResponse(bw, method, res, st.id)
	if backendErr != nil {
		// The headers are out: all the client can be told is a cut connection.
		p.log.Warn("backend failed mid-response", "app", route.App, "request_id", st.id, "err", backendErr)
		return false
	}
	if err != nil {
		st.status = StatusClientClosedRequest
		p.log.Debug("client went away", "request_id", st.id, "err", err)
		return false
	}
	return true
}

// informationalTo returns the trace that relays a backend's 1xx responses (103
// Early Hints, say) to lc's client as they come, as ReverseProxy does.
func informationalTo(lc *laneConn) *httptrace.ClientTrace {
	return &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		writeHead(lc.bw, code, http.Header(h))
		return lc.bw.Flush()
	}}
}

// writeLaneResponse writes res to the client as the http.Server does for a
// ReverseProxy: hop-by-hop headers removed, a Date and a sniffed Content-Type
// if the backend sent none, the body with its length or else chunked, streamed
// (flushed after every read) when its length is unknown or it is an event stream,
// trailers after a chunked body. It returns the body bytes written, an error of
// the backend's body (the response is cut), or the client's.
func writeLaneResponse(bw *bufio.Writer, method string, res *http.Response, id string) (n int64, backendErr, err error) {
	defer res.Body.Close()
	hdr := res.Header
	removeHopByHop(hdr)
	hdr[HeaderRequestID] = []string{id}
	if _, ok := hdr["Date"]; !ok {
		hdr["Date"] = []string{time.Now().UTC().Format(http.TimeFormat)}
	}
	code := res.StatusCode
	if method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified {
		writeHead(bw, code, hdr)
		return 0, nil, bw.Flush()
	}

	buf := copyBuffers.Get()
	defer copyBuffers.Put(buf)
	chunked := res.ContentLength < 0
	if chunked {
		delete(hdr, "Content-Length")
		hdr["Transfer-Encoding"] = []string{"chunked"}
		if len(res.Trailer) > 0 {
			keys := make([]string, 0, len(res.Trailer))
			for k := range res.Trailer {
				keys = append(keys, k)
			}
			hdr["Trailer"] = []string{strings.Join(keys, ", ")}
		}
	} else if len(hdr["Content-Length"]) != 1 {
		// ReadResponse checked a Content-Length header against the body's length.
		hdr["Content-Length"] = []string{strconv.FormatInt(res.ContentLength, 10)}
	}
	stream := chunked || isEventStream(hdr)

	var first []byte
	var rerr error
	_, haveType := hdr["Content-Type"]
	_, haveEncoding := hdr["Content-Encoding"]
	if !haveType && !haveEncoding {
		// net/http's server sniffs a type from the first bytes the handler writes.
		var k int
		k, rerr = res.Body.Read(buf)
		first = buf[:k]
		if k > 0 {
			hdr["Content-Type"] = []string{http.DetectContentType(first)}
		}
	}
	writeHead(bw, code, hdr)
	write := func(p []byte) error {
		if chunked {
			bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
			bw.WriteString("\r\n")
			bw.Write(p)
			bw.WriteString("\r\n")
		} else if _, err := bw.Write(p); err != nil {
			return err
		}
		n += int64(len(p))
		if stream {
			return bw.Flush()
		}
		return nil
	}
	if len(first) > 0 {
		if err := write(first); err != nil {
			return n, nil, err
		}
	}
	for rerr == nil {
		var k int
		k, rerr = res.Body.Read(buf)
		if k > 0 {
			if err := write(buf[:k]); err != nil {
				return n, nil, err
			}
		}
	}
	if rerr != io.EOF {
		bw.Flush()
		return n, rerr, nil
	}
	if chunked {
		bw.WriteString("0\r\n")
		res.Trailer.Write(bw)
		bw.WriteString("\r\n")
	}
	return n, nil, bw.Flush()
}

// writeHead writes the status line and headers, as net/http's server words them.
func writeHead(bw *bufio.Writer, code int, hdr http.Header) {
	bw.WriteString("HTTP/1.1 ")
	var b [8]byte
	bw.Write(strconv.AppendInt(b[:0], int64(code), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(code); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.Write(strconv.AppendInt(b[:0], int64(code), 10))
	}
	bw.WriteString("\r\n")
	hdr.Write(bw)
	bw.WriteString("\r\n")
}

// hopHeaders are the hop-by-hop headers ReverseProxy removes (RFC 9110 7.6.1
// and the older ones still seen).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop removes the headers named in Connection and the hopHeaders.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		delete(h, f)
	}
}

// isEventStream: server-sent events go out as they come, whatever their length.
func isEventStream(h http.Header) bool {
	const sse = "text/event-stream"
	ct := h["Content-Type"]
	if len(ct) == 0 {
		return false
	}
	v := strings.TrimLeft(ct[0], " \t")
	return len(v) >= len(sse) && strings.EqualFold(v[:len(sse)], sse) &&
		(len(v) == len(sse) || v[len(sse)] == ';' || v[len(sse)] == ' ' || v[len(sse)] == '\t')
}

// watchAfter is how long the lane waits for a backend's response headers before it
// watches the client's connection for a close, as net/http does from the start
// of every request; that watch is a goroutine and a read, which most requests
// (answered within milliseconds) never pay for.
const watchAfter = 20 * time.Millisecond

// laneCtx is a lane connection's context for its requests' round trips, which
// come one after the other: its values are the request in flight's state
// (stateKey), the connection's interrupter and the trace that relays 1xx
// responses; it ends when the Server closes. One per connection, where
// net/http's way would cost a context, a cancel registration and a context value
// per request.
type laneCtx struct {
	context.Context
	st *reqState
	in interrupter
}

func (c *laneCtx) Value(key any) any {
	switch key.(type) {
	case stateKey:
		return c.st
	case interrupterKey:
		return &c.in
	}
	return c.Context.Value(key)
}

// clientWatch notices a client that closes its connection while the lane waits
// for a slow backend, and interrupts the round trip: the backend's work is
// abandoned and the access log says 499, as with net/http. There is one per
// connection, and its timer is reused from request to request.
type clientWatch struct {
	lc        *laneConn
	br        *bufio.Reader
	interrupt func()
	timer     *time.Timer

	mu    sync.Mutex
	armed bool          // a request waits for its backend
	done  chan struct{} // set while a watch reads the connection
}

func newClientWatch(lc *laneConn, br *bufio.Reader, interrupt func()) *clientWatch {
	w := &clientWatch{lc: lc, br: br, interrupt: interrupt}
	w.timer = time.AfterFunc(time.Hour, w.watch)
	w.timer.Stop()
	return w
}

// start arms the watch for a request that now waits for its backend.
func (w *clientWatch) start() {
	w.mu.Lock()
	w.armed, w.done = true, nil
	w.mu.Unlock()
	w.timer.Reset(watchAfter)
}

// watch blocks on the client connection: a close or reset interrupts the round
// trip; a pipelined request, or the deadline that stop sets, ends the watch. A
// late run of the timer of an earlier request only starts the watch early; two
// never read at once.
func (w *clientWatch) watch() {
	w.mu.Lock()
	if !w.armed || w.done != nil {
		w.mu.Unlock()
		return
	}
	done := make(chan struct{})
	w.done = done
	w.mu.Unlock()
	defer close(done)
	if _, err := w.br.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		w.interrupt()
	}
}

// stop disarms the watch, and returns once nothing reads the client connection.
func (w *clientWatch) stop() {
	w.timer.Stop()
	w.mu.Lock()
	w.armed = false
	done := w.done
	w.mu.Unlock()
	if done != nil {
		w.lc.SetReadDeadline(time.Unix(1, 0))
		<-done
	}
}
