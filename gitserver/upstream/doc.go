// Package upstream says which upstream URLs an app may fetch from, and dials
// them only where that holds.
//
// An upstream is fetched by the gitserver, from inside the server's network: a
// member who could point it anywhere could reach the API server on loopback, a
// database on the LAN or the cloud's metadata service (SSRF), and scan ports by
// the errors. So, unless the admin starts the gitserver with
// --allow-private-upstreams (a Gitea on the LAN), an upstream's host may not be a
// loopback, private (RFC 1918, CGNAT 100.64.0.0/10, ULA fc00::/7), link-local
// (169.254.0.0/16, fe80::/10, with the metadata addresses 169.254.169.254 and
// fd00:ec2::254), multicast or unspecified address (internal/nonpublic: the one
// list, which the tenants' filter rules read too). Policy.Check refuses such a URL
// when it is set, for a literal address and for a name that resolves to one; the
// Dialer checks the address each connection actually goes to (net.Dialer.Control
// sees the IP after resolution), so a name that resolves to a public address when
// set and to 127.0.0.1 at fetch time (DNS rebinding), or an https redirect to a
// private address, gets nowhere. Both of go-git's network transports dial through
// it: https with an http.Client of its own (no proxy from the environment), ssh
// through ProxyDialer.
//
// Credentials never sit in the URL (Check refuses user:password@ with the advice
// to use --username and --password-stdin, which keeps them in a Secret), and
// Redact hides whatever user information a URL has, for messages and logs.
package upstream
