// Package clientaddr says which client a request comes from when proxies in
// front of bex are trusted to name it: the edge behind a load balancer, the
// gitserver's webhooks and MCP endpoint behind the edge. One rule for all of
// them: from a trusted peer, the client is the last X-Forwarded-For hop that
// is not itself a trusted proxy (hops further left were written by whoever
// sent the request and can say anything); from anyone else, the peer.
package clientaddr
