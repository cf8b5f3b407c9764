package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// createNetwork makes the node's network namespace and the veth pair that joins it
// to the host: HOST_VETH (host, hostIP/30) and eth0 (node, nodeIP/30). Nothing else
// changes on the host: no forwarding, no NAT, no route beyond the /30, so the host
// reaches only the node's address, and (isolate) nothing in the node opens a
// connection to the host.
func (l *layout) createNetwork() error {
	if _, err := os.Stat("/run/netns/" + l.netns()); err == nil {
		// Left by an up that failed half way, or an earlier cluster in this DIR.
		if err := l.deleteNetwork(); err != nil {
			return err
		}
	}
	steps := [][]string{
		{"netns", "add", l.netns()},
		{"link", "add", l.hostVeth(), "type", "veth", "peer", "name", "eth0", "netns", l.netns()},
		{"addr", "add", l.hostIP.String() + "/30", "dev", l.hostVeth()},
		{"link", "set", l.hostVeth(), "up"},
		{"-n", l.netns(), "link", "set", "lo", "up"},
		{"-n", l.netns(), "addr", "add", l.nodeIP.String() + "/30", "dev", "eth0"},
		{"-n", l.netns(), "link", "set", "eth0", "up"},
		// No default route: nothing in the node reaches past the host's end of
		// the link. Service addresses need a route for the first routing decision,
		// before kube-proxy's DNAT sends them to a pod or to the API server.
		{"-n", l.netns(), "route", "add", serviceCIDR, "via", l.hostIP.String()},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			_ = l.deleteNetwork()
			return err
		}
	}
	if err := l.isolate(); err != nil {
		_ = l.deleteNetwork()
		return err
	}
	return nil
}

// isolate keeps everything in the node from opening a connection to the host:
// the host's end of the veth answers on every address the host listens on
// (0.0.0.0), and a tenant's pod must reach none of them. Connections the host
// opens (kubectl, ssh, https, node ports) get their replies; nothing in the node
// needs to start one the other way. The rules live in the node's namespace and go
// with it.
func (l *layout) isolate() error {
	rules := [][]string{
		{"-N", "BEX-NODE-EGRESS"},
		{"-A", "BEX-NODE-EGRESS", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
		{"-A", "BEX-NODE-EGRESS", "-j", "REJECT"},
		// A pod's packet that leaves by eth0 (the host's address; with no default
		// route there is nowhere else to go).
		{"-I", "FORWARD", "1", "-o", "eth0", "-j", "BEX-NODE-EGRESS"},
		// The node's own processes and host-network pods (the edge), to the host.
		// By address: a Service's packet is routed to eth0 before kube-proxy's DNAT
		// sends it elsewhere.
		{"-I", "OUTPUT", "1", "-d", l.hostIP.String(), "-j", "BEX-NODE-EGRESS"},
	}
	for _, r := range rules {
		args := append([]string{"--net=/run/netns/" + l.netns(), "--", "iptables", "-w"}, r...)
		if out, err := exec.Command("nsenter", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s in %s: %v: %s", strings.Join(r, " "), l.netns(), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// deleteNetwork removes the namespace (and with it eth0, the bridge, the pods'
// veths and kube-proxy's rules) and the host's end of the pair, which the kernel
// removes with its peer; it is deleted explicitly too in case the namespace was
// gone already.
func (l *layout) deleteNetwork() error {
	var errs []error
	if _, err := os.Stat("/run/netns/" + l.netns()); err == nil {
		if err := ip("netns", "delete", l.netns()); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + l.hostVeth()); err == nil {
		if err := ip("link", "delete", l.hostVeth()); err != nil && linkExists(l.hostVeth()) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
