// Package sourcelimit limits failed attempts per source address: a token
// bucket per source, in a bounded map, where only the attempts that fail keep
// their token. A source that has failed a burst of
// times is refused, without the attempt being made, until its bucket refills;
// an attempt that succeeds costs nothing.
//
// The MCP endpoint uses it for bearer tokens that do not verify. Sources are
// addresses as a server sees them (http.Request.RemoteAddr): IPv4 addresses
// one by one, IPv6 addresses by /64, since one host commonly holds a whole /64.
// Behind a proxy every client has the proxy's address and shares one bucket;
// a caller that trusts the proxy's X-Forwarded-For passes the client's address
// instead.
package sourcelimit
