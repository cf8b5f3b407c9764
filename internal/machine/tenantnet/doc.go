// Package tenantnet is the network of the tenants of one machine: the app
// instances of the local runtime and the build steps of buildkitd. Each runs in a
// network namespace of its own, attached by CNI (Debian's
// containernetworking-plugins) with a `ptp` veth pair: the container's eth0 has
// one address of its subnet and a default route to the host, the host's end has
// the gateway address and a /32 route to the container. Nothing is bridged, so
// every packet a tenant sends is routed by the host and passes its filter: INPUT
// for the host's own addresses, FORWARD for anything else.
//
// The filter rules live in chains of bex's own (BEX-INPUT, BEX-FORWARD, in
// the nat table BEX-POSTROUTING, in the raw table BEX-PREROUTING), jumped to
// first from the built-in chains. Install writes them all in one
// iptables-restore transaction per table (a second start, or two processes at
// once, leave the same rules); Remove takes the jumps and the chains away. From
// a tenant:
//
//   - raw PREROUTING: a packet that comes in on a tenant's interface (veth+, the
//     host's end of ptp's pair) from a source whose route does not go back out of
//     it is dropped (rpfilter): a forged source gets nowhere, and the rules below,
//     which match the source subnet, match exactly the tenants' traffic;
//   - INPUT: replies to connections the host opened (the edge, health checks) are
//     accepted, DNS to a resolver that runs on the host is accepted, the host's
//     public ports (AllowHostPorts), the rest is dropped: no listener of the
//     platform is reachable on any host address;
//   - FORWARD: tenant to tenant (app to app, build to app, either subnet) is
//     dropped; only replies come back in; out, the resolvers of resolv.conf are
//     reached on port 53, the ranges of Config.AllowEgress are reached, the
//     ranges that are not the Internet (internal/nonpublic: loopback, private,
//     CGNAT, link-local with the cloud metadata address, multicast) are refused,
//     the Internet is reached;
//   - POSTROUTING: what leaves for elsewhere is masqueraded.
//
// IPv6 is switched off on the container's interface (the `tuning` plugin), and
// IPv6 that comes in on a tenant's interface all the same (a packet socket) is
// dropped in ip6tables' raw table (Rules6): a tenant has no link-local path to the
// host's listeners on [::].
//
// Namespaces are files (bind mounts of a namespace) that NewNetNS makes and
// RemoveNetNS unmounts; the container runtime joins them by path. A Network
// attaches one (CNI ADD through go-cni) and detaches it (CNI DEL); DetachAll
// releases every namespace kept in the local runtime's layout (<dir>/<id>/netns),
// for bex up when it stops. go-cni keeps CNI's result cache in libcni's default
// /var/lib/cni/results (it has no option for another directory), keyed by network
// and namespace id, which are unique.
package tenantnet
