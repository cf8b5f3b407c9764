// Package stepnet confines the network of build steps inside buildkitd's pod on a
// cluster (infra/bex/buildkitd.yaml). buildkitd's OCI worker puts each RUN step in
// a network namespace of its own on a bridge in the pod (its "cni" network mode,
// the conflist in the buildkitd ConfigMap); Apply, run once by the pod's init
// container (`bex build-network`), writes the nftables rules of the pod's network
// namespace that decide what a step reaches through that bridge:
//
//   - nothing of the pod itself (buildkitd's port included) and no other step on the
//     bridge (a concurrent build of another app);
//   - DNS (port 53) at the pod's resolvers only;
//   - no loopback, private, CGNAT, link-local (the cloud metadata address), ULA,
//     multicast or broadcast address (internal/nonpublic, the list `bex up` and the
//     gitserver's upstream rules use), and no address in Config.Block (the node's
//     own, which may be public), unless Config.Allow opens a range;
//   - the rest (the Internet) through masquerade, as the pod.
//
// Steps are matched by the interface their packets come in by (the bridge), not by
// their source address, so a step that forges its source gains nothing. The rules
// are nftables rules of their own table, written over netlink (no iptables binary in
// the image), in one transaction that replaces the table: whatever else writes
// iptables rules in the namespace (the CNI plugins) cannot order itself before
// them, since a packet must pass every base chain and a reject in one is final.
package stepnet
