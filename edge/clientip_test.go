package edge

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
)

// spoofedAddr is what the attacker claims to be in every header apps read a
// client's address from.
var spoofedAddr = []string{"X-Real-IP: 1.2.3.4", "True-Client-IP: 1.2.3.4", "X-Client-IP: 1.2.3.4",
	"CF-Connecting-IP: 1.2.3.4", "Forwarded: for=1.2.3.4", "X-Forwarded-For: 1.2.3.4", "X_Real_IP: 1.2.3.4"}

// wantClient fails unless the app's last request said the client is ip, in
// X-Real-IP and X-Forwarded-For, and nothing else about the client's address.
func (f *laneFixture) wantClient(t *testing.T, what, ip string) {
	t.Helper()
	h := f.last(t).Header
	if got := strings.Join(h["X-Real-Ip"], ","); got != ip {
		t.Errorf("%s: the app got X-Real-IP %q, want %q", what, got, ip)
	}
	if got := strings.Join(h["X-Forwarded-For"], ","); got != ip {
		t.Errorf("%s: the app got X-Forwarded-For %q, want %q", what, got, ip)
	}
	for _, k := range []string{"True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "Forwarded", "X_real_ip"} {
		if v, ok := h[k]; ok {
			t.Errorf("%s: the app got the client's %s %q", what, k, v)
		}
	}
}

// curl runs the real curl against the fixture with extra arguments and returns
// the status it got.
func (f *laneFixture) curl(t *testing.T, args ...string) string {
	t.Helper()
	_, httpPort, _ := net.SplitHostPort(f.http)
	_, httpsPort, _ := net.SplitHostPort(f.https)
	base := []string{"-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
		"--resolve", "web.localhost:" + httpPort + ":127.0.0.1", "--resolve", "web.localhost:" + httpsPort + ":127.0.0.1"}
	out, err := exec.Command("curl", append(base, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %q: %v: %s", args, err, out)
	}
	return string(out)
}

func headerArgs(hdrs []string) []string {
	var out []string
	for _, h := range hdrs {
		out = append(out, "-H", h)
	}
	return out
}

// TestClientAddressHeadersAreTheEdges: a client that names itself 1.2.3.4 in
// every header frameworks trust gets nowhere, in the fast lane, through
// net/http (a POST is handed over) and over HTTP/2: the app sees the address
// the edge saw. Load balancers are trusted, but not this client's loopback.
func TestClientAddressHeadersAreTheEdges(t *testing.T) {
	f := newLaneFixtureWith(t, Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}, echoMethodAndBody)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, f.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	spoof := headerArgs(spoofedAddr)
	for _, c := range []struct {
		name     string
		args     []string
		handoffs float64
	}{
		{"GET in the lane", []string{"http://web.localhost:" + portOf(f.http) + "/"}, 0},
		{"POST through net/http", []string{"-d", "x=1", "http://web.localhost:" + portOf(f.http) + "/"}, 1},
		{"HTTP/2", []string{"--http2", "--cacert", caFile, "https://web.localhost:" + portOf(f.https) + "/"}, 2},
	} {
		if got := f.curl(t, append(spoof, c.args...)...); got != "200" {
			t.Fatalf("%s: status %s", c.name, got)
		}
		f.wantClient(t, c.name, "127.0.0.1")
		if f.handoffs() != c.handoffs {
			t.Errorf("%s: %v handoffs, want %v (the path under test was not taken)", c.name, f.handoffs(), c.handoffs)
		}
	}
	// Control: with no header of its own, the client is still named.
	if got := f.curl(t, "http://web.localhost:"+portOf(f.http)+"/"); got != "200" {
		t.Fatalf("plain GET: %s", got)
	}
	f.wantClient(t, "a plain GET", "127.0.0.1")
}

// TestTrustedProxyNamesTheClient: with the test's loopback as the trusted load
// balancer, the client it names in a PROXY header (v1 and v2, over HTTP and
// under TLS) or as the last untrusted hop of X-Forwarded-For is the one the app
// sees; what the client itself wrote, further left or in other headers, is not.
func TestTrustedProxyNamesTheClient(t *testing.T) {
	f := newLaneFixtureWith(t, Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, echoMethodAndBody)
	get := "GET / HTTP/1.1\r\nHost: web.localhost\r\n" + strings.Join(spoofedAddr[:5], "\r\n") + "\r\n\r\n"
	post := "POST / HTTP/1.1\r\nHost: web.localhost\r\nContent-Length: 1\r\nX-Real-IP: 1.2.3.4\r\n\r\nx"
	for _, c := range []struct {
		name    string
		version byte
		raw     string
	}{
		{"PROXY v1, GET in the lane", 1, get},
		{"PROXY v2, GET in the lane", 2, get},
		{"PROXY v1, POST through net/http", 1, post},
		{"PROXY v2, POST through net/http", 2, post},
	} {
		conn := dialWithProxyHeader(t, f.http, c.version, "203.0.113.7")
		res := readOne(t, conn, c.raw)
		conn.Close()
		if res.StatusCode != 200 {
			t.Fatalf("%s: status %d", c.name, res.StatusCode)
		}
		f.wantClient(t, c.name, "203.0.113.7")
	}

	// Under TLS, as a TCP load balancer in front of the edge's HTTPS sends it.
	for _, v := range []byte{1, 2} {
		raw := dialWithProxyHeader(t, f.https, v, "203.0.113.7")
		conn := tls.Client(raw, &tls.Config{RootCAs: f.roots, ServerName: "web.localhost", NextProtos: []string{"http/1.1"}})
		res := readOne(t, conn, get)
		conn.Close()
		if res.StatusCode != 200 {
			t.Fatalf("PROXY v%d under TLS: status %d", v, res.StatusCode)
		}
		f.wantClient(t, fmt.Sprintf("PROXY v%d under TLS", v), "203.0.113.7")
		if got := f.last(t).Header.Get("X-Forwarded-Proto"); got != "https" {
			t.Errorf("PROXY v%d under TLS: X-Forwarded-Proto %q", v, got)
		}
	}

	// An HTTP load balancer on loopback: the last hop it did not add itself.
	for _, c := range []struct{ xff, want string }{
		{"1.2.3.4, 203.0.113.7", "203.0.113.7"},             // the client's claim is left of the balancer's hop
		{"203.0.113.7, 127.0.0.9", "203.0.113.7"},           // a second trusted proxy in the chain
		{"1.2.3.4", "1.2.3.4"},                              // the balancer's word is all there is
		{"not-an-address, 203.0.113.7:4711", "203.0.113.7"}, // a port, and garbage left of it
	} {
		if got := f.curl(t, "-H", "X-Forwarded-For: "+c.xff, "-H", "X-Real-IP: 6.6.6.6", "http://web.localhost:"+portOf(f.http)+"/"); got != "200" {
			t.Fatalf("X-Forwarded-For %q: %s", c.xff, got)
		}
		f.wantClient(t, "X-Forwarded-For "+c.xff, c.want)
	}

	// The client a PROXY header names is not a trusted proxy: its own
	// X-Forwarded-For (the load balancer passed its bytes as they were) counts for
	// nothing.
	conn := dialWithProxyHeader(t, f.http, 2, "203.0.113.7")
	res := readOne(t, conn, "GET / HTTP/1.1\r\nHost: web.localhost\r\nX-Forwarded-For: 1.2.3.4, 127.0.0.1\r\n\r\n")
	conn.Close()
	if res.StatusCode != 200 {
		t.Fatalf("PROXY with X-Forwarded-For: %d", res.StatusCode)
	}
	f.wantClient(t, "a proxied client's own X-Forwarded-For", "203.0.113.7")
}

// TestUntrustedProxyHeaderIsNotRead: from an address that is not a trusted
// proxy, a PROXY header is not read: it reaches the HTTP parser as the request
// line it is not (400), and the app never hears of 203.0.113.7. A plain request
// from there is served as always.
func TestUntrustedProxyHeaderIsNotRead(t *testing.T) {
	f := newLaneFixtureWith(t, Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}, echoMethodAndBody)
	get := "GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n"
	for _, v := range []byte{1, 2} {
		conn := dialWithProxyHeader(t, f.http, v, "203.0.113.7")
		conn.Write([]byte(get))
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err == nil && res.StatusCode != http.StatusBadRequest {
			t.Errorf("PROXY v%d from an untrusted address: status %d, want 400", v, res.StatusCode)
		}
	}
	f.mu.Lock()
	for _, r := range f.seen {
		if r.Header.Get("X-Real-Ip") == "203.0.113.7" {
			t.Errorf("the app was told the client is 203.0.113.7: %v", r.Header)
		}
	}
	f.mu.Unlock()
	if got := f.curl(t, "http://web.localhost:"+portOf(f.http)+"/"); got != "200" {
		t.Fatalf("a plain GET from the same address: %s", got)
	}
	f.wantClient(t, "a plain GET", "127.0.0.1")
}

// dialWithProxyHeader connects to addr and sends a PROXY header of version v
// (written by go-proxyproto, as a load balancer writes it) naming client.
func dialWithProxyHeader(t *testing.T, addr string, v byte, client string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	dst := c.RemoteAddr().(*net.TCPAddr)
	h := &proxyproto.Header{Version: v, Command: proxyproto.PROXY, TransportProtocol: proxyproto.TCPv4,
		SourceAddr: &net.TCPAddr{IP: net.ParseIP(client), Port: 40123}, DestinationAddr: dst}
	if _, err := h.WriteTo(c); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// readOne writes raw on c and reads one response.
func readOne(t *testing.T, c net.Conn, raw string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}
