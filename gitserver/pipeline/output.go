package pipeline

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
)

// Output is what a push says to the pusher. With side-band-64k, messages travel on
// band 2 (git prints them as `remote: ` lines) and the report on band 1; without it,
// messages are dropped (git has nowhere to show them) and the report goes out plain.
//
// Lines follow Dokku's vocabulary, which reads well in a terminal and in CI logs:
// "-----> " for a step, seven spaces for detail, " !     " for an error. Colour would
// be SGR codes only; there is no cursor movement, which newer git shows as text.
type Output struct {
	mu        sync.Mutex
	raw       io.Writer // the session's stdout
	mux       *sideband.Muxer
	plain     bool // no git on the other end: messages go to raw as they are
	lastWrite time.Time
}

// NewOutput writes to the session's stdout w. git asks for "quiet" whenever its
// stderr is not a terminal; bex's lines are the push's result, not a progress meter,
// so they are sent regardless: CI logs need the build output most.
func NewOutput(w io.Writer, sideband64k bool) *Output {
	o := &Output{raw: w, lastWrite: time.Now()}
	if sideband64k {
		o.mux = sideband.NewMuxer(sideband.Sideband64k, w)
	}
	return o
}

// Write sends progress bytes as they come (the builder's and the deployer's lines).
func (o *Output) Write(p []byte) (int, error) {
	return o.band(sideband.ProgressMessage, p)
}

// NewPlainOutput writes the same lines to w with no git framing, for deploys that
// do not come from a push (Server.Deploy).
func NewPlainOutput(w io.Writer) *Output {
	if w == nil {
		w = io.Discard
	}
	return &Output{raw: w, plain: true, lastWrite: time.Now()}
}

func (o *Output) band(ch sideband.Channel, p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.plain {
		return o.raw.Write(p)
	}
	if o.mux == nil {
		return len(p), nil
	}
	o.lastWrite = time.Now()
	return o.mux.WriteChannel(ch, p)
}

func (o *Output) Step(format string, args ...any) {
	o.lines("-----> ", format, args...)
}

func (o *Output) Detail(format string, args ...any) {
	o.lines("       ", format, args...)
}

// fail prints an error.
func (o *Output) Fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(msg, "\n"), "\n") {
		b.WriteString(" !     " + line + "\n")
	}
	_, _ = o.band(sideband.ProgressMessage, []byte(b.String()))
}

func (o *Output) lines(prefix, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(msg, "\n"), "\n") {
		b.WriteString(prefix + line + "\n")
	}
	_, _ = o.Write([]byte(b.String()))
}

// keepAlive sends an empty band-1 packet when nothing was sent for at least d, as
// git's own receive-pack does (receive.keepAlive): clients ignore it, proxies see
// traffic.
func (o *Output) KeepAlive(d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mux == nil || time.Since(o.lastWrite) < d {
		return
	}
	o.lastWrite = time.Now()
	_, _ = io.WriteString(o.raw, "0005\x01")
}

// report returns the writer for report-status: band 1, or the plain stream.
func (o *Output) Report() io.Writer {
	if o.mux == nil {
		return o.raw
	}
	return writerFunc(func(p []byte) (int, error) { return o.band(sideband.PackData, p) })
}

// flush ends the sideband stream, after which git stops reading.
func (o *Output) Flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mux != nil {
		_, _ = io.WriteString(o.raw, "0000")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
