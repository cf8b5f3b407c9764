package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"

	"bex.co/bex/internal/nonpublic"
)

// Policy is what upstreams this server fetches from.
type Policy struct {
	// AllowPrivate lets upstreams be on loopback, private, link-local and
	// metadata addresses (bex gitserver --allow-private-upstreams): for a git host
	// on the LAN. Off by default.
	AllowPrivate bool
	// AllowFile lets upstreams be file:// URLs (--allow-file-upstreams).
	AllowFile bool
	// Resolver looks names up when a URL is checked; nil: net.DefaultResolver.
	Resolver Resolver
}

// Resolver looks up a host's addresses (net.Resolver does).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ErrRefused is wrapped by every refusal of Check and the Dialer.
var ErrRefused = errors.New("upstream refused")

// Blocked says what ip is when no upstream may be there without AllowPrivate
// ("a loopback address"), or "" when it is a public address: the ranges of
// internal/nonpublic, the list the tenants' filter rules keep apps and builds
// from too. An IPv4 address mapped into IPv6 (::ffff:127.0.0.1) is judged as the
// IPv4 one.
func Blocked(ip netip.Addr) string { return nonpublic.What(ip) }

// CheckIP refuses ip under p, naming it.
func (p Policy) CheckIP(ip netip.Addr) error {
	if p.AllowPrivate {
		return nil
	}
	if what := Blocked(ip); what != "" {
		return fmt.Errorf("%w: %s is %s, which upstreams may not be on (an admin can allow them: bex gitserver --allow-private-upstreams)", ErrRefused, ip.Unmap(), what)
	}
	return nil
}

const wantURL = "want https://HOST/PATH, ssh://HOST/PATH, git@HOST:PATH or file:///PATH"

// Parse parses an upstream URL (https://, ssh://, git@HOST:PATH or file:///) as
// go-git does, refusing credentials in it.
func Parse(raw string) (*transport.Endpoint, error) {
	if len(raw) > 2048 || strings.ContainsAny(raw, " \t\r\n") {
		return nil, fmt.Errorf("%w: upstream %q: %s", ErrRefused, Redact(raw), wantURL)
	}
	ep, err := transport.NewEndpoint(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: upstream %q: %s", ErrRefused, Redact(raw), wantURL)
	}
	if ep.Password != "" || (ep.Protocol != "ssh" && ep.User != "") {
		return nil, fmt.Errorf("%w: %s: credentials do not go in the URL (it is shown and logged): give the URL without them and --username USER --password-stdin", ErrRefused, Redact(raw))
	}
	return ep, nil
}

// Check refuses an upstream URL this server would not fetch: not a git URL, a
// scheme other than https, ssh and (with AllowFile) file, credentials in it, or a
// host on an address Blocked names, given literally or as a name that resolves
// there. A name that does not resolve now is accepted: the Dialer checks again
// at every fetch.
func (p Policy) Check(ctx context.Context, raw string) error {
	ep, err := Parse(raw)
	if err != nil {
		return err
	}
	switch ep.Protocol {
	case "https", "ssh":
	case "file":
		if !p.AllowFile {
			return fmt.Errorf("%w: file:// upstreams are off on this server (they could name any repository on it, another app's too): start bex gitserver with --allow-file-upstreams", ErrRefused)
		}
		return nil
	default:
		return fmt.Errorf("%w: upstream %q: %s", ErrRefused, Redact(raw), wantURL)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(ep.Host, "["), "]")
	if host == "" {
		return fmt.Errorf("%w: %s has no host", ErrRefused, Redact(raw))
	}
	if p.AllowPrivate {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return p.CheckIP(ip)
	}
	r := p.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for _, ip := range ips {
		if err := p.CheckIP(ip); err != nil {
			return fmt.Errorf("%s resolves to %s: %w", host, ip.Unmap(), err)
		}
	}
	return nil
}

// Dialer returns a dialer that connects only to the addresses p allows: its
// Control sees the address after resolution, for each address tried.
func (p Policy) Dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: p.Control}
}

// Control is the Dialer's check of the address a connection is about to be
// made to ("IP:PORT").
func (p Policy) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: dialing %q: %v", ErrRefused, address, err)
	}
	return p.CheckIP(ap.Addr())
}

// Redact hides the user information of a URL (a password most of all), for
// messages and logs. An scp-like git@HOST:PATH is kept: its user is no secret.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.Index(s, "://"); i >= 0 {
			// Unparseable, but it may still carry user:password@.
			rest := s[i+3:]
			if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
				return s[:i+3] + "REDACTED@" + rest[at+1:]
			}
		}
		return s
	}
	if _, has := u.User.Password(); has || u.Scheme != "ssh" {
		u.User = url.User("REDACTED")
	}
	return u.String()
}
