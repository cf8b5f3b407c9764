// Package edge is bex's HTTP front door: it owns the routing table (which app answers
// at which host, and which backends serve it) and the reverse proxy that carries each
// request to one of those backends, and the certificates of its TLS listener
// (Certificates: only for hosts Table.Known says are routed).
//
// The table is built from two kinds of API objects and nothing else: the Apps of one
// namespace (name, spec.domains, spec.suspended) and the EndpointSlices that the
// runtime publishes for each app's web process (label
// kubernetes.io/service-name=<app>, ready endpoints only; see deployer/runtime). Both
// come from a controller-runtime informer cache, so a request never waits on the API
// server: the current table is an immutable snapshot behind an atomic pointer, and a
// lookup is a map read. Informer events rebuild the snapshot off the request path,
// coalesced so that a burst of events (the initial sync, a large rollout) costs a few
// rebuilds, not one per object.
//
// The runtime writes a release's new slices before it deletes the old ones, and
// keeps old instances running for a drain period after that, so following the slices
// never routes to a stopped backend. The proxy still retries a refused connection
// once on another backend for idempotent requests without a body: that covers the
// instant of a switch and a backend dying between two snapshots.
//
// Set-up order:
//
//  1. build the cache (cache.New, or a manager's GetCache), restricted to the apps'
//     namespace if it serves nothing else;
//  2. call NewTable, which registers the App and EndpointSlice informers and their
//     event handlers — before the cache starts, so the informers start with it rather
//     than lazily on a first read;
//  3. start the cache (c.Start in a goroutine);
//  4. serve NewProxy(cfg, table, log, registerer) with Proxy.NewServer (its fast
//     lane for plain HTTP/1.1 GETs, net/http for everything else; see Server), or
//     from an http.Server passed to Proxy.ConfigureServer (header limits,
//     timeouts, the connections gauge). Requests that arrive before the cache has
//     synced get 503 "starting", never a false 404.
//
// The client's address reaches apps in X-Real-IP and X-Forwarded-For, set by the
// edge (clientip.go): client-sent address headers are dropped, and only peers in
// Config.TrustedProxies may name another client, by X-Forwarded-For or by a PROXY
// protocol header (Proxy.ProxyProtocol wraps the listeners). Certificates
// (Certificates, tls.go) are obtained ahead of time for the table's hosts and on
// demand for the rest, within Config.OrdersPerDomain and Config.Orders (orders.go).
//
// Errors are the edge's own small pages (HTML if the client accepts it, else
// text): unknown host 404, suspended app 503, no ready backend 503, backend
// unreachable 502, backend too slow to send headers 504. A client that left is
// logged as 499. The transport decides the status (BackendError) where the cause
// is known; the ReverseProxy's ErrorHandler and the fast lane only render it.
package edge
