package edge

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLaneAnswersAsNetHTTP sends the same raw requests, well-formed or not, to the
// Server (fast lane in front of net/http) and to a plain http.Server with the same
// Proxy, and expects the same answers and the same requests at the backend: the
// lane may only take what it serves exactly as net/http and ReverseProxy would.
// Each request is followed on its connection by a plain GET, so that a lane that
// took too many or too few bytes shows in the second answer.
func TestLaneAnswersAsNetHTTP(t *testing.T) {
	f := newLaneFixture(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var hdr []string
		for k, vv := range r.Header {
			if k != HeaderRequestID {
				hdr = append(hdr, fmt.Sprintf("%s=%q", k, vv))
			}
		}
		slices.Sort(hdr)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s %s host=%s body=%q\n%s\n", r.Method, r.RequestURI, r.Host, body, strings.Join(hdr, "\n"))
	})
	plain := &http.Server{Handler: f.proxy}
	f.proxy.ConfigureServer(plain)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(l)
	t.Cleanup(func() { plain.Close() })

	rng := rand.New(rand.NewPCG(9, 9)) // fixed: a failure names its case, and repeats
	const follow = "GET /next HTTP/1.1\r\nHost: web.localhost\r\nX-Request-Id: next\r\n\r\n"
	const cases = 400
	inLane := 0
	for i := range cases {
		raw := randomRequest(rng)
		before := f.handoffs()
		lane := exchange(t, f.http, raw+follow)
		if f.handoffs() == before {
			inLane++
		}
		want := exchange(t, l.Addr().String(), raw+follow)
		if lane != want {
			t.Errorf("case %d, request %q:\nlane:     %s\nnet/http: %s", i, raw, lane, want)
		}
	}
	// Both paths must be exercised for the comparison to mean something.
	if inLane < cases/5 || inLane > cases*4/5 {
		t.Errorf("%d of %d cases stayed in the lane; the generator should mix both ways", inLane, cases)
	}
	t.Logf("%d of %d cases stayed in the lane", inLane, cases)
}

// exchange writes raw on a new connection and describes the answers it reads (at
// most two) until the server closes or goes quiet: status, framing, type and
// body, with request ids the edge made up blanked.
func exchange(t *testing.T, addr, raw string) string {
	t.Helper()
	c := sendRaw(t, addr, raw, 2*time.Second)
	defer c.Close()
	br := bufio.NewReader(c)
	// The first answer's framing depends on its method (no body after HEAD's
	// headers); the second answers the GET that follows.
	method, _, _ := strings.Cut(raw, " ")
	var out []string
	for _, m := range []string{method, "GET"} {
		res, err := http.ReadResponse(br, &http.Request{Method: m})
		if err != nil {
			out = append(out, "end")
			break
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			out = append(out, "cut")
			break
		}
		out = append(out, fmt.Sprintf("%d len=%d type=%q id=%v body=%q", res.StatusCode, res.ContentLength,
			res.Header.Get("Content-Type"), res.Header.Get(HeaderRequestID) != "", madeUpID.ReplaceAllString(string(body), "ID")))
		if res.Close {
			break
		}
	}
	return strings.Join(out, " | ")
}

var madeUpID = regexp.MustCompile(`[0-9a-f]{32}`)

// randomRequest makes a request head (and body) from pieces that the lane takes and
// pieces that it must leave to net/http, valid and invalid.
func randomRequest(rng *rand.Rand) string {
	pick := func(options ...string) string { return options[rng.IntN(len(options))] }
	often := func(common string, others ...string) string {
		if rng.IntN(3) > 0 {
			return common
		}
		return pick(others...)
	}
	var b strings.Builder
	target := pick("/", "/a/b", "/%7Euser", "/a?b=1&c=2", "/a?x;y", "/a?%zz", "*", "http://web.localhost/abs",
		"//double", "/a%2Fb?q", "/very/"+strings.Repeat("long/", 50))
	if rng.IntN(2) == 0 {
		// Half the cases are what the lane is for: a GET or HEAD with headers from
		// browsers, curl and other proxies, some odd but valid.
		fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", pick("GET", "HEAD"), target, pick("web.localhost", "web.localhost:80", "WEB.localhost"))
		for range rng.IntN(5) {
			b.WriteString(pick("Connection: keep-alive", "X-Forwarded-For: 6.6.6.6", "X-Forwarded-Host: evil",
				"Forwarded: for=6.6.6.6", "X-Forwarded-Proto: https", "X-Request-Id: client-1", "X-Request-Id: has space",
				"X-Tab: a\tb", "X-High: caf\xc3\xa9", "X-Empty:", "X-Trail: x  ", "Accept: text/html", "User-Agent: curl/8",
				"User-Agent:", "Cookie: a=1; b=2", "If-None-Match: \"x\"", "X-Dup: 1\r\nX-Dup: 2", "x-lower: v",
				"Keep-Alive: timeout=5", "Te: trailers", "Proxy-Connection: keep-alive", "X-Real-IP: 6.6.6.6",
				"True-Client-IP: 6.6.6.6", "X-Client-IP: 6.6.6.6", "CF-Connecting-IP: 6.6.6.6", "X_Real_IP: 6.6.6.6") + "\r\n")
		}
		b.WriteString("\r\n")
		return b.String()
	}
	eol := often("\r\n", "\n")
	method := often("GET", "HEAD", "POST", "OPTIONS", "get", "DELETE", "PUT")
	version := often("HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.2", "http/1.1")
	fmt.Fprintf(&b, "%s %s %s%s", method, target, version, eol)
	var body string
	for range rng.IntN(6) + 1 {
		switch rng.IntN(14) {
		case 0, 1, 2:
			b.WriteString(pick("Host: web.localhost", "Host: web.localhost:80", "Host: WEB.localhost", "Host: nope.localhost",
				"Host: web.localhost\r\nHost: web.localhost", "Host: we b.localhost", "Host: ") + eol)
		case 3:
			b.WriteString(pick("Connection: keep-alive", "Connection: close", "Connection: Upgrade", "Connection: keep-alive, X-Drop",
				"connection: KEEP-ALIVE") + eol)
		case 4:
			cl := pick("0", "3", "-1", "3, 3", "x")
			b.WriteString("Content-Length: " + cl + eol)
			if cl == "3" || cl == "3, 3" {
				body = "abc"
			}
		case 5:
			b.WriteString(pick("Transfer-Encoding: chunked", "Transfer-Encoding: gzip, chunked", "Transfer-Encoding: identity") + eol)
			body = "3\r\nabc\r\n0\r\n\r\n"
		case 6:
			b.WriteString(pick("Expect: 100-continue", "Upgrade: websocket", "Te: trailers", "Keep-Alive: timeout=5",
				"Proxy-Connection: keep-alive", "Trailer: X-T") + eol)
		case 7:
			b.WriteString(pick("X-Forwarded-For: 6.6.6.6", "X-Forwarded-Host: evil", "Forwarded: for=6.6.6.6",
				"X-Forwarded-Proto: https", "X-Real-IP: 6.6.6.6", "True-Client-IP: 6.6.6.6", "X_Forwarded_For: 6.6.6.6") + eol)
		case 8:
			b.WriteString(pick("X-Request-Id: client-1", "X-Request-Id: has space", "X-Request-Id: "+strings.Repeat("i", 200)) + eol)
		case 9:
			b.WriteString(pick("X-Tab: a\tb", "X-Folded: a"+eol+" continued", "X-High: caf\xc3\xa9", "X-Empty:", "X-Ctl: a\x01b",
				"Bad Name: x", "X-Colon:: x", ": novalue", "X-Trail: x  ") + eol)
		case 10:
			b.WriteString(pick("Accept: text/html", "Accept: */*", "User-Agent: curl/8", "User-Agent:") + eol)
		case 11:
			b.WriteString("X-Big: " + strings.Repeat("b", pick2(rng, 10, 5000)) + eol)
		default:
			b.WriteString(pick("Cookie: a=1; b=2", "Cache-Control: no-cache", "If-None-Match: \"x\"") + eol)
		}
	}
	b.WriteString(eol)
	b.WriteString(body)
	return b.String()
}

func pick2(rng *rand.Rand, a, b int) int {
	if rng.IntN(2) == 0 {
		return a
	}
	return b
}
