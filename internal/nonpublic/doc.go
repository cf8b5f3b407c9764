// Package nonpublic is the one list of the address ranges that are not the
// Internet: loopback, private (RFC 1918, CGNAT 100.64.0.0/10, ULA fc00::/7),
// link-local (169.254.0.0/16, fe80::/10, with the cloud metadata addresses
// 169.254.169.254 and fd00:ec2::254), multicast, unspecified and broadcast.
//
// Two rules read it, so that they cannot drift apart: the gitserver refuses
// upstreams and deploy:image registries there (gitserver/upstream), and the
// tenants' filter rules keep apps, one-offs and build steps from reaching it
// (internal/machine/tenantnet, FORWARD). From a machine on a LAN or in a cloud, these
// are the addresses of the LAN's services, the platform's own listeners and the
// metadata service (which holds a node's user-data on Hetzner); whatever a
// hostile tenant or URL should not reach without the operator saying so.
package nonpublic
