package main

import (
	"net/netip"
	"strings"

	"bex.co/bex/internal/machine/tenantnet"
)

// egressFlag is --allow-tenant-egress: the ranges that tenants may reach
// although they are not the Internet (tenantnet.Config.AllowEgress). bex up,
// the deployer and the gitserver each install the tenants' rules (the last two
// through the local runtime, for instances and one-offs), so each takes the
// flag, and bex up passes its own on: one that installed none would take the
// others' ranges away.
type egressFlag []netip.Prefix

const egressUsage = "IPv4 ranges, CIDR[,CIDR...], that apps, one-offs, cron, release commands and build steps may reach although they are not the Internet, e.g. a database on the LAN: 192.168.1.20/32; by default loopback, private (RFC 1918), CGNAT, link-local (cloud metadata) and multicast addresses are closed to them, while the resolvers of /etc/resolv.conf stay open on port 53"

func (e *egressFlag) String() string {
	var s []string
	for _, p := range *e {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// Set adds the ranges of s: the flag given twice holds both.
func (e *egressFlag) Set(s string) error {
	p, err := tenantnet.ParseEgress(s)
	if err != nil {
		return err
	}
	*e = append(*e, p...)
	return nil
}

func (e *egressFlag) Type() string { return "CIDR,..." }
