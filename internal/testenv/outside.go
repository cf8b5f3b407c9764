package testenv

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"bex.co/bex/internal/machine/tenantnet"
)

// Outside is a network namespace that stands for the internet in isolation
// tests: reached from the host through a veth pair on a /30 of 198.18.0.0/15
// (the benchmarking range, routed nowhere), with a TCP server and a DNS server
// listening inside it. A tenant that reaches it proves that its outbound traffic
// is routed and masqueraded; the host's own listeners stay out of its reach.
type Outside struct {
	// Addr is the namespace's address, where both servers listen.
	Addr netip.Addr
	// TCPPort is the port of the TCP server, which writes Greeting and closes.
	TCPPort int
	// Name resolves to Addr at the DNS server on Addr:53 (any name under
	// Domain does).
	Name string
	// Peers lists the source addresses of the connections the TCP server
	// accepted, as it saw them (masqueraded: the host's end of the veth).
	peersMu sync.Mutex
	peers   []string
}

// Greeting is what Outside's TCP server writes.
const Greeting = "hello-from-outside"

// Domain is the zone the Outside DNS server answers for.
const Domain = "outside.bex-test"

// StartOutside creates the namespace, its veth pair and its servers; all go
// when the test ends.
func StartOutside(t testing.TB) *Outside {
	t.Helper()
	p := newPeerNS(t, 18, "bexout-", "bxo")
	name, nsAddr := p.name, p.nsAddr

	o := &Outside{Addr: nsAddr, Name: "probe." + Domain}
	var l net.Listener
	var pc net.PacketConn
	err := tenantnet.InNetNS("/run/netns/"+name, func() error {
		var err error
		if l, err = net.Listen("tcp", net.JoinHostPort(nsAddr.String(), "0")); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", net.JoinHostPort(nsAddr.String(), "53"))
		return err
	})
	if err != nil {
		t.Fatalf("outside servers: %v", err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	o.TCPPort = l.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			o.peersMu.Lock()
			o.peers = append(o.peers, c.RemoteAddr().String())
			o.peersMu.Unlock()
			_, _ = c.Write([]byte(Greeting + "\n"))
			c.Close()
		}
	}()
	go serveDNS(pc, nsAddr)
	return o
}

// Peers returns the source addresses of the accepted connections.
func (o *Outside) Peers() []string {
	o.peersMu.Lock()
	defer o.peersMu.Unlock()
	return append([]string(nil), o.peers...)
}

// serveDNS answers A queries for names under Domain with addr, and every other
// query with an empty NOERROR answer (busybox's nslookup asks for AAAA too).
func serveDNS(pc net.PacketConn, addr netip.Addr) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, err := dnsAnswer(buf[:n], addr); err == nil {
			_, _ = pc.WriteTo(resp, from)
		}
	}
}

func dnsAnswer(q []byte, addr netip.Addr) ([]byte, error) {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil, errors.New("want one question")
	}
	i := 12
	var labels []string
	for {
		if i >= len(q) {
			return nil, errors.New("short name")
		}
		l := int(q[i])
		i++
		if l == 0 {
			break
		}
		if l > 63 || i+l > len(q) {
			return nil, errors.New("bad label")
		}
		labels = append(labels, string(q[i:i+l]))
		i += l
	}
	if i+4 > len(q) {
		return nil, errors.New("short question")
	}
	qtype := binary.BigEndian.Uint16(q[i : i+2])
	question := q[12 : i+4]
	name := strings.ToLower(strings.Join(labels, "."))
	answer := qtype == 1 && (name == Domain || strings.HasSuffix(name, "."+Domain))
	resp := make([]byte, 0, 64)
	resp = append(resp, q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0)
	if answer {
		resp[7] = 1
	} else if !strings.HasSuffix(name, Domain) {
		resp[3] = 0x83 // NXDOMAIN
	}
	resp = append(resp, question...)
	if answer {
		a := addr.As4()
		resp = append(resp, 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		resp = append(resp, a[:]...)
	}
	return resp, nil
}
