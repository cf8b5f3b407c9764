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
// the nat table BEX-POSTROUTING, in the raw table BEX-PREROUTING; and the
// chains of the databases, below), jumped to
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
// Managed databases run as app instances and are reached by the apps at a
// stable address: the apps' gateway (AppsGateway, the first address of
// AppsSubnet) and a port of the database's. Expose puts a DNAT in the nat
// table's BEX-DATABASES (jumped to from PREROUTING) that leads connections from
// the apps' subnet to that port to the database instance's own address; the
// rule's comment is the database's name, by which Expose finds it again, so a
// port is held by one name. What may use it is the filter table's BEX-LINKS,
// jumped to by the first rule of BEX-FORWARD for traffic within the apps'
// subnet: AllowLinks puts there, per linked instance (owner: its network
// namespace's id, the comment) and port, an ACCEPT of the connections whose
// original tuple in conntrack is that instance's address to that port of the
// gateway. Both directions of such a connection pass, before the
// tenant-to-tenant drop; nothing else does: an instance that is not linked is
// led to the database and dropped there, a linked one cannot reach the
// database's own address, a build step is not led at all (the DNAT is the apps'
// subnet's), and the host's own listener on that port is not what an app
// reaches. Inside the subnet nothing is masqueraded: the database sees the
// app's own address. RemoveLinks and SweepLinks (owners that are gone, which
// Attached tells from the machine's CNI attachments, as the chain is shared by
// every bex on the machine) take links away; Install keeps both chains' rules,
// Remove deletes them.
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
