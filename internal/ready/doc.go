// Package ready is the one readiness loop of bex: the supervisor of bex up's
// children (internal/machine/supervise) and the test harness's daemons
// (internal/testenv) and hack/clusterlocal wait with Wait until a started
// process answers a check, and take the common checks from here (TCP: every
// address accepts connections; Get: an HTTP health endpoint answers 200;
// UnixHTTP: the same on a unix socket). Wait stops early when the
// process exits, and says so, so that the caller shows the end of its log rather
// than waiting out the timeout.
package ready
