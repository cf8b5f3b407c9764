package testenv

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"bex.co/bex/internal/machine/tenantnet"
)

// LAN is a network namespace that stands for the machine's LAN (a database on
// 10.0.0.5, the cloud's metadata service) in isolation tests. Its addresses are
// the ones the test gives, private or link-local, and the host reaches each by a
// /32 route through a veth pair of its own (on a /30 of 198.19.0.0/16, routed
// nowhere), so that nothing a wrong rule lets through leaves the machine. On
// each address a TCP server writes "lan <address>" and a UDP listener records
// the datagrams it receives; on the first one a DNS server answers, as the
// machine's resolver on a private address does.
type LAN struct {
	Addrs []netip.Addr
	// TCPPort and UDPPort are the servers' ports, the same on every address.
	TCPPort, UDPPort int

	mu        sync.Mutex
	peers     []string
	datagrams []Datagram
}

// Datagram is what the LAN's UDP listener received: from whom, what.
type Datagram struct {
	From    netip.AddrPort
	To      netip.Addr
	Payload string
}

// StartLAN creates the namespace with addrs, its veth pair, routes and servers;
// all go when the test ends.
func StartLAN(t testing.TB, addrs ...netip.Addr) *LAN {
	t.Helper()
	p := newPeerNS(t, 19, "bexlan-", "bxl")
	name, hostIf, nsAddr, ip := p.name, p.hostIf, p.nsAddr, p.ip
	for _, a := range addrs {
		ip("-n", name, "addr", "add", a.String()+"/32", "dev", "lo")
		// The host's route to it: the veth's deletion takes it along.
		ip("route", "add", a.String()+"/32", "via", nsAddr.String(), "dev", hostIf)
	}

	lan := &LAN{Addrs: addrs}
	var ls []net.Listener
	var pcs []net.PacketConn
	var dns net.PacketConn
	err := tenantnet.InNetNS("/run/netns/"+name, func() error {
		// One port for all: the first address chooses it.
		for i, a := range addrs {
			l, err := net.Listen("tcp4", net.JoinHostPort(a.String(), fmt.Sprint(lan.TCPPort)))
			if err != nil {
				return err
			}
			ls = append(ls, l)
			pc, err := net.ListenPacket("udp4", net.JoinHostPort(a.String(), fmt.Sprint(lan.UDPPort)))
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
			if i == 0 {
				lan.TCPPort, lan.UDPPort = l.Addr().(*net.TCPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port
				if dns, err = net.ListenPacket("udp4", net.JoinHostPort(a.String(), "53")); err != nil {
					return err
				}
			}
		}
		return nil
	})
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close()
		}
		for _, pc := range pcs {
			pc.Close()
		}
		if dns != nil {
			dns.Close()
		}
	})
	if err != nil {
		t.Fatalf("LAN servers: %v", err)
	}
	for i, l := range ls {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				lan.mu.Lock()
				lan.peers = append(lan.peers, c.RemoteAddr().String())
				lan.mu.Unlock()
				_, _ = fmt.Fprintf(c, "lan %s\n", addrs[i])
				c.Close()
			}
		}()
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pcs[i].ReadFrom(buf)
				if err != nil {
					return
				}
				lan.mu.Lock()
				lan.datagrams = append(lan.datagrams, Datagram{From: from.(*net.UDPAddr).AddrPort(), To: addrs[i], Payload: string(buf[:n])})
				lan.mu.Unlock()
			}
		}()
	}
	if dns != nil {
		go serveDNS(dns, addrs[0])
	}
	return lan
}

// Peers returns the source addresses of the TCP connections accepted.
func (l *LAN) Peers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.peers...)
}

// Datagrams returns the UDP datagrams received.
func (l *LAN) Datagrams() []Datagram {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Datagram(nil), l.datagrams...)
}
