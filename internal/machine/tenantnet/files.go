package tenantnet

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strings"
)

// ResolvConf is the host's resolv.conf as a namespace sees it: nameservers on
// loopback are dropped (the namespace's loopback is its own, and the host's is
// what a tenant must not reach); search and options lines are kept.
func ResolvConf(host []byte) []byte {
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(host))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Unmap().IsLoopback() {
				continue
			}
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes()
}

// Hosts is the /etc/hosts of a namespace whose address is addr and whose host
// name is hostname: localhost is the namespace's own loopback.
func Hosts(hostname string, addr netip.Addr) []byte {
	return fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", addr, hostname)
}
