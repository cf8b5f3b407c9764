package ready

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWaitUntilTheCheckSucceeds(t *testing.T) {
	n := 0
	err := Wait(context.Background(), time.Millisecond, nil, func(context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("Wait: %v after %d checks, want nil after 3", err, n)
	}
}

func TestWaitStopsWhenTheProcessExits(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	err := Wait(context.Background(), time.Hour, exited, func(context.Context) error { return errors.New("refused") })
	var e *Error
	if !errors.As(err, &e) || !e.Exited || e.Last.Error() != "refused" {
		t.Fatalf("got %v, want an Error that says the process exited", err)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := Wait(ctx, 5*time.Millisecond, nil, func(context.Context) error { return errors.New("refused") })
	var e *Error
	if !errors.As(err, &e) || e.Exited || e.Last.Error() != "refused" {
		t.Fatalf("got %v, want an Error with the last check's", err)
	}
}

func TestTCPAndUnixHTTP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := TCP(l.Addr().String())(context.Background()); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		_ = http.Serve(ul, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/readyz" {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
	}()
	if err := UnixHTTP(socket, "/readyz")(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := UnixHTTP(socket, "/other")(context.Background()); err == nil {
		t.Fatal("a 503 passed the check")
	}
}

func TestLogTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.log")
	if err := os.WriteFile(path, []byte("one\ntwo\nthree\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := LogTail(path, 2), "    two\n    three"; got != want {
		t.Errorf("LogTail = %q, want %q", got, want)
	}
	if got := LogTail(filepath.Join(t.TempDir(), "none"), 2); !strings.HasPrefix(got, "    (open ") {
		t.Errorf("LogTail of a missing file = %q", got)
	}
}
