package edge

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// rawBackend answers every request on a connection with answer(n) (n counts the
// requests of that connection from 0), then closes the connection if closeAfter
// says so. It counts the connections it accepted.
func rawBackend(t *testing.T, answer func(n int) string, closeAfter func(n int) bool) (backendPort int, conns *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					io.WriteString(c, answer(n))
					if closeAfter(n) {
						return
					}
				}
			}()
		}
	}()
	return port(t, l.Addr()), conns
}

// proxyTo serves a proxy whose only app, "b", has the backend at port.
func proxyTo(t *testing.T, cfg Config, backendPort int) string {
	t.Helper()
	table := staticTable("localhost", []appv1.App{app("b")}, []discoveryv1.EndpointSlice{
		slice("b", discoveryv1.AddressTypeFQDN, int32(backendPort), ep(nil, "127.0.0.1")),
	})
	p, err := NewProxy(cfg, table, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + serve(t, p, nil)
}

func getB(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Host = "b.localhost"
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

func ok(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// TestBackendConnectionsAreReused: requests one after the other share one
// connection to the backend.
func TestBackendConnectionsAreReused(t *testing.T) {
	p, conns := rawBackend(t, func(n int) string { return ok(fmt.Sprint("answer ", n)) }, func(int) bool { return false })
	url := proxyTo(t, Config{}, p)
	c := &http.Client{}
	for i := range 20 {
		if status, body := getB(t, c, url); status != 200 || body != fmt.Sprint("answer ", i) {
			t.Fatalf("request %d: %d %q", i, status, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("20 requests took %d backend connections, want 1", n)
	}
}

// TestBackendClosedIdleConnection: a backend that closes a kept-alive connection
// after each response, without saying so, costs no failed request: the next
// request finds the pooled connection closed and goes again on a new one.
func TestBackendClosedIdleConnection(t *testing.T) {
	p, conns := rawBackend(t, func(int) string { return ok("fresh") }, func(int) bool { return true })
	url := proxyTo(t, Config{}, p)
	c := &http.Client{}
	for i := range 10 {
		if status, body := getB(t, c, url); status != 200 || body != "fresh" {
			t.Fatalf("request %d: %d %q", i, status, body)
		}
	}
	if n := conns.Load(); n != 10 {
		t.Errorf("%d backend connections for 10 requests, each on a connection closed after it; want 10", n)
	}
}

// TestBackendResponses covers what the short path must do as net/http's Transport
// does: 1xx responses reach the client, a body cut short is an error, Connection:
// close is honoured, and headers over the limit are a 502.
func TestBackendResponses(t *testing.T) {
	t.Run("early hints", func(t *testing.T) {
		p, _ := rawBackend(t, func(int) string {
			return "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + ok("final")
		}, func(int) bool { return false })
		url := proxyTo(t, Config{}, p)
		var hints []string
		req, _ := http.NewRequest("GET", url, nil)
		req.Host = "b.localhost"
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				hints = append(hints, fmt.Sprint(code, h))
				return nil
			}}))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(body) != "final" || len(hints) != 1 || !strings.Contains(hints[0], "style.css") {
			t.Fatalf("%d %q, 1xx seen: %v", res.StatusCode, body, hints)
		}
	})
	t.Run("connection close", func(t *testing.T) {
		p, conns := rawBackend(t, func(int) string {
			return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye"
		}, func(int) bool { return true })
		url := proxyTo(t, Config{}, p)
		c := &http.Client{}
		for range 3 {
			if status, body := getB(t, c, url); status != 200 || body != "bye" {
				t.Fatalf("%d %q", status, body)
			}
		}
		if n := conns.Load(); n != 3 {
			t.Errorf("%d connections, want 3 (each closed as announced)", n)
		}
	})
	t.Run("headers too large", func(t *testing.T) {
		p, _ := rawBackend(t, func(int) string {
			return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("x", 8000) + "\r\nContent-Length: 2\r\n\r\nok"
		}, func(int) bool { return false })
		url := proxyTo(t, Config{MaxHeaderBytes: 4096}, p)
		if status, body := getB(t, &http.Client{}, url); status != http.StatusBadGateway {
			t.Fatalf("%d %q, want 502", status, body)
		}
	})
	t.Run("truncated body", func(t *testing.T) {
		p, _ := rawBackend(t, func(int) string {
			return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"
		}, func(int) bool { return true })
		url := proxyTo(t, Config{}, p)
		req, _ := http.NewRequest("GET", url, nil)
		req.Host = "b.localhost"
		// The client sees an error, before the headers or in the body: never a
		// short body that looks complete.
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		if err == nil {
			t.Fatal("a body cut short by the backend reached the client as complete")
		}
	})
}
