package upstream_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"bex.co/bex/gitserver/upstream"
)

// fakeResolver answers every name with its addresses, as a DNS server that
// says what an attacker wants would.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ips, ok := r[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestBlocked(t *testing.T) {
	for ip, want := range map[string]string{
		"127.0.0.1": "loopback", "127.8.9.10": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
		"10.0.0.1": "private", "172.16.5.4": "private", "172.31.255.255": "private", "192.168.1.1": "private",
		"100.64.0.1": "CGNAT", "100.127.255.254": "CGNAT", "fd12:3456::1": "ULA", "fc00::1": "ULA",
		"169.254.1.1": "link-local", "fe80::1": "link-local", "fe80::1%eth0": "link-local",
		"169.254.169.254": "metadata", "fd00:ec2::254": "metadata", "::ffff:169.254.169.254": "metadata",
		"0.0.0.0": "unspecified", "::": "unspecified", "224.0.0.1": "multicast", "ff02::1": "multicast",
	} {
		if got := upstream.Blocked(netip.MustParseAddr(ip)); !strings.Contains(got, want) {
			t.Errorf("Blocked(%s) = %q, want %q", ip, got, want)
		}
	}
	// The control: public addresses, and the neighbours of the private ranges.
	for _, ip := range []string{"1.1.1.1", "8.8.8.8", "140.82.112.3", "172.32.0.1", "100.128.0.1", "169.255.0.1", "2606:4700::1111", "fe00::1"} {
		if got := upstream.Blocked(netip.MustParseAddr(ip)); got != "" {
			t.Errorf("Blocked(%s) = %q, want public", ip, got)
		}
	}
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	p := upstream.Policy{Resolver: fakeResolver{
		"git.example.com":  addrs("140.82.112.3"),
		"evil.example.com": addrs("140.82.112.4", "10.1.2.3"),
		"meta.example.com": addrs("169.254.169.254"),
		"v6.example.com":   addrs("::1"),
	}}
	for url, want := range map[string]string{
		"https://127.0.0.1:6443/x":            "127.0.0.1 is a loopback address",
		"https://[::1]/x":                     "::1 is a loopback address",
		"https://[fe80::1%25eth0]/x":          "link-local",
		"http://10.0.0.1/x":                   `upstream "http://10.0.0.1/x": want https://`,
		"https://10.0.0.1/x":                  "10.0.0.1 is a private address",
		"https://100.64.1.1/x":                "CGNAT",
		"https://169.254.169.254/latest":      "metadata",
		"https://[fd00:ec2::254]/x":           "metadata",
		"ssh://git@192.168.1.10:22/r.git":     "private",
		"git@172.20.0.1:team/r.git":           "private",
		"https://evil.example.com/x":          "evil.example.com resolves to 10.1.2.3",
		"https://meta.example.com/x":          "meta.example.com resolves to 169.254.169.254",
		"ssh://git@v6.example.com/x":          "v6.example.com resolves to ::1",
		"https://u:hunter2@git.example.com/x": "--password-stdin",
		"https://tok@git.example.com/x":       "--password-stdin",
		"file:///srv/git/x.git":               "--allow-file-upstreams",
		"ftp://git.example.com/x":             "want https://",
	} {
		err := p.Check(ctx, url)
		if err == nil || !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%s) = %v, want a refusal with %q", url, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Check(%s) shows the password: %v", url, err)
		}
	}
	// A name that resolves to loopback through the system's resolver
	// (/etc/hosts), not a test's.
	if err := (upstream.Policy{}).Check(ctx, "https://localhost:8443/x"); err == nil || !strings.Contains(err.Error(), "localhost resolves to") {
		t.Errorf("localhost: %v", err)
	}
	// The controls: public upstreams, a name that does not resolve now (the dial
	// checks it), and private ones where the admin allows them.
	for _, url := range []string{"https://git.example.com/team/shop.git", "https://140.82.112.3/x.git", "ssh://git@git.example.com/team/shop.git",
		"git@git.example.com:team/shop.git", "https://nowhere.example.com/x"} {
		if err := p.Check(ctx, url); err != nil {
			t.Errorf("Check(%s): %v", url, err)
		}
	}
	lan := upstream.Policy{AllowPrivate: true, AllowFile: true}
	for _, url := range []string{"https://10.0.0.1/x", "https://127.0.0.1:3000/x", "ssh://git@192.168.1.10/x", "file:///srv/git/x.git"} {
		if err := lan.Check(ctx, url); err != nil {
			t.Errorf("with private and file upstreams allowed, Check(%s): %v", url, err)
		}
	}
	if err := lan.Check(ctx, "https://u:p@10.0.0.1/x"); err == nil {
		t.Error("credentials in the URL accepted with private upstreams allowed")
	}
}

// TestDialerChecksTheAddressItConnectsTo: a real listener on loopback is never
// reached through the checked dialer, whatever name leads there; with private
// upstreams allowed it is.
func TestDialerChecksTheAddressItConnectsTo(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	for _, addr := range []string{l.Addr().String(), net.JoinHostPort("localhost", port)} {
		_, err := upstream.Policy{}.Dialer(0).Dial("tcp", addr)
		if !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("dial %s: %v, want refused", addr, err)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the listener accepted %d connections through the checked dialer", n)
	}
	c, err := upstream.Policy{AllowPrivate: true}.Dialer(0).Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("with private upstreams allowed: %v", err)
	}
	c.Close()
	// A public address passes the check (no connection is made here: this
	// machine has no way out).
	if err := (upstream.Policy{}).Control("tcp4", "140.82.112.3:443", nil); err != nil {
		t.Fatalf("a public address: %v", err)
	}
	for _, addr := range []string{"[::ffff:10.0.0.1]:443", "[fe80::1%lo]:22", "[::]:22", "0.0.0.0:22"} {
		if err := (upstream.Policy{}).Control("tcp", addr, nil); err == nil {
			t.Errorf("the dial to %s passed", addr)
		}
	}
}

// TestRebinding: a name that resolved to a public address when the upstream was
// set, and to loopback when it is fetched, reaches nothing: the https client
// dials through the checked dialer. The system resolves localhost to 127.0.0.1;
// the check at set time is given a resolver that says otherwise.
func TestRebinding(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "https://"))
	url := "https://localhost:" + port + "/team/shop.git/info/refs?service=git-upload-pack"
	p := upstream.Policy{Resolver: fakeResolver{"localhost": addrs("140.82.112.3")}}
	if err := p.Check(context.Background(), url); err != nil {
		t.Fatalf("at set time the name was public: %v", err)
	}
	_, err := p.HTTPClient(0, nil).Get(url)
	if !errors.Is(err, upstream.ErrRefused) || !strings.Contains(err.Error(), "127.0.0.1 is a loopback address") {
		t.Fatalf("the fetch: %v, want refused at the dial", err)
	}
	// The control: with private upstreams allowed the same client reaches it,
	// through a redirect too (each connection a redirect makes is dialed by the
	// same checked dialer, so a public host redirecting to loopback gets the
	// refusal above).
	redirect := httptest.NewTLSServer(http.RedirectHandler(srv.URL+"/x", http.StatusFound))
	defer redirect.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	cli := upstream.Policy{AllowPrivate: true}.HTTPClient(0, roots)
	if _, err := cli.Get(redirect.URL); err != nil {
		t.Fatalf("the control, private upstreams allowed: %v", err)
	}
	if hits.Load() != 1 {
		t.Fatalf("the server was reached %d times, want once (by the control)", hits.Load())
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"https://u:hunter2@git.example.com/x": "https://REDACTED@git.example.com/x",
		"https://token@git.example.com/x":     "https://REDACTED@git.example.com/x",
		"ssh://git@git.example.com/x":         "ssh://git@git.example.com/x",
		"git@git.example.com:team/x.git":      "git@git.example.com:team/x.git",
		"https://git.example.com/x":           "https://git.example.com/x",
		"https://u:hun%zz@host/x":             "https://REDACTED@host/x",
	} {
		if got := upstream.Redact(in); got != want {
			t.Errorf("Redact(%s) = %s, want %s", in, got, want)
		}
	}
}
