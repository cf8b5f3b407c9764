package ready

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// attemptTimeout bounds one readiness check, so that a daemon that accepts and
// never answers costs one attempt, not the whole wait.
const attemptTimeout = 2 * time.Second

// Error is Wait's error: the process exited first (Exited), or the
// wait ended; Last is the last check's error. The caller says which process and
// where its log is.
type Error struct {
	Exited bool
	Last   error
}

func (e *Error) Error() string {
	if e.Exited {
		return "exited before it was ready"
	}
	return "not ready: " + e.Last.Error()
}

func (e *Error) Unwrap() error { return e.Last }

// Wait calls check, each call bounded by two seconds, every interval until it
// succeeds, exited is closed (the process is gone), or ctx ends. Its error is an
// *Error.
func Wait(ctx context.Context, interval time.Duration, exited <-chan struct{}, check func(context.Context) error) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, attemptTimeout)
		last := check(attempt)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return &Error{Exited: true, Last: last}
		case <-ctx.Done():
			return &Error{Last: last}
		case <-time.After(interval):
		}
	}
}

// TCP is a check that succeeds once every address accepts TCP connections.
func TCP(addrs ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, a := range addrs {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", a)
			if err != nil {
				return err
			}
			conn.Close()
		}
		return nil
	}
}

// UnixHTTP is a check that succeeds once path answers 200 on the HTTP server
// at the unix socket.
func UnixHTTP(socket, path string) func(context.Context) error {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	return func(ctx context.Context) error {
		if err := Get(ctx, hc, "http://localhost"+path); err != nil {
			return fmt.Errorf("%s: %w", socket, err)
		}
		return nil
	}
}

// Get is the check of an HTTP health endpoint: a GET of url with hc answers
// 200. Its error names the URL, the status and the start of the body (etcd's and
// the API server's say there what is not ready).
func Get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return nil
}

// LogTail returns the last n lines of the log file at path, indented, for the
// error of a process that is not ready: its log is where the cause is.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "    (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}
