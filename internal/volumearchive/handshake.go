package volumearchive

import (
	"bytes"
	"context"
	"errors"
	"io"
	"time"
)

// The helper pod of a backup on a cluster writes the archive on its stdout,
// which the gitserver reads through an attach (pods/attach): what a container
// writes before the attach is connected is lost to it. So the helper waits for
// the reader: it writes ReadyLine every HandshakeEvery until a byte arrives on
// its stdin (which the reader sends once it read a ReadyLine: its attach is
// connected), then StartLine, then the archive. The reader drops everything up
// to StartLine (Awaiter).
const (
	ReadyLine      = "bex-volume-archive: ready\n"
	StartLine      = "bex-volume-archive: start\n"
	HandshakeEvery = 200 * time.Millisecond
)

// ExitRefused is the exit status of `bex volume-archive restore` when it refuses
// the archive (ErrBadArchive): nothing was changed.
const ExitRefused = 2

// AwaitReader writes ReadyLine to out until a byte can be read from in, then
// StartLine. An in that ends first, or ctx, is an error.
func AwaitReader(ctx context.Context, in io.Reader, out io.Writer) error {
	got := make(chan error, 1)
	go func() {
		var b [1]byte
		n, err := in.Read(b[:])
		if n == 1 {
			err = nil
		} else if err == nil || errors.Is(err, io.EOF) {
			err = errors.New("stdin ended before the reader's go-ahead")
		}
		got <- err
	}()
	t := time.NewTicker(HandshakeEvery)
	defer t.Stop()
	for {
		if _, err := io.WriteString(out, ReadyLine); err != nil {
			return err
		}
		select {
		case err := <-got:
			if err != nil {
				return err
			}
			_, err = io.WriteString(out, StartLine)
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Awaiter is the reader's side: a writer of the helper's stdout that calls
// Ready once (on the first ReadyLine) and passes what follows StartLine to W.
type Awaiter struct {
	W     io.Writer
	Ready func()
	buf   []byte
	ready bool
	// Started is true once StartLine went by: what W got is the archive.
	Started bool
}

func (a *Awaiter) Write(p []byte) (int, error) {
	if a.Started {
		return a.W.Write(p)
	}
	a.buf = append(a.buf, p...)
	if !a.ready && bytes.Contains(a.buf, []byte(ReadyLine)) {
		a.ready = true
		if a.Ready != nil {
			a.Ready()
		}
	}
	if i := bytes.Index(a.buf, []byte(StartLine)); i >= 0 {
		rest := a.buf[i+len(StartLine):]
		a.Started, a.buf = true, nil
		if len(rest) > 0 {
			if _, err := a.W.Write(rest); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	}
	// Before the start only ready lines (or parts of them) come: keep a tail
	// long enough to hold a line cut in two.
	if n := len(a.buf); n > 2*len(StartLine) {
		a.buf = append(a.buf[:0], a.buf[n-2*len(StartLine):]...)
	}
	return len(p), nil
}
