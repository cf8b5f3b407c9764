// Package tenantnet is the network of the tenants of one machine: the app
// instances of the local runtime and the build steps of buildkitd. Each runs in a
// network namespace of its own, attached by CNI (Debian's
// containernetworking-plugins) with a `ptp` veth pair: the container's eth0 has
// one address of its subnet and a default route to the host, the host's end has
// the gateway address and a /32 route to the container. Nothing is bridged, so
// every packet a tenant sends is routed by the host and passes its filter: INPUT
// for the host's own addresses, FORWARD for anything else.
//
// The filter rules live in chains of bex's own (BEX-INPUT, BEX-FORWARD and, in
// the nat table, BEX-POSTROUTING), jumped to first from INPUT, FORWARD and
// POSTROUTING. Install adds what is missing (each rule checked with -C first, so
// two processes installing at once, or a second start, change nothing); Remove
// takes the jumps and the chains away. From a tenant subnet:
//
//   - INPUT: replies to connections the host opened (the edge, health checks) are
//     accepted, DNS to a resolver that runs on the host is accepted, the rest is
//     dropped: no listener of the platform is reachable on any host address;
//   - FORWARD: tenant to tenant (app to app, build to app, either subnet) is
//     dropped; tenant to elsewhere is accepted, and only replies come back in;
//   - POSTROUTING: what leaves for elsewhere is masqueraded.
//
// IPv6 is switched off on the container's interface (the `tuning` plugin), so that a
// tenant has no link-local path to the host's listeners on [::].
//
// Namespaces are files (bind mounts of a namespace) that NewNetNS makes and
// RemoveNetNS unmounts; the container runtime joins them by path. A Network
// attaches one (CNI ADD through go-cni) and detaches it (CNI DEL); DetachAll
// releases every namespace kept in the local runtime's layout (<dir>/<id>/netns),
// for bex up when it stops. go-cni keeps CNI's result cache in libcni's default
// /var/lib/cni/results (it has no option for another directory), keyed by network
// and namespace id, which are unique.
package tenantnet
