package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// Loopback returns a TCP port on 127.0.0.1 that was free a moment ago. It is
// chosen outside the kernel's ephemeral range (ip_local_port_range): a port from
// `listen :0` is an ephemeral one, and any outgoing connection on the machine may
// take it as its source port between this check and the daemon's bind (seen under
// load: "bind: address already in use" for Pebble's validation port and for the
// API server's port of a fresh bex up). A port bex up keeps in its state is
// likewise safer outside that range at every later start.
func Loopback() (int, error) {
	lo, hi := ephemeralRange()
	// Below the ephemeral range if it leaves room, else above it.
	first, last := 10000, lo-1
	if last-first < 1000 {
		first, last = hi+1, 65535
	}
	for range 100 {
		port := first + rand.IntN(last-first+1)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free TCP port on 127.0.0.1 between %d and %d after 100 tries", first, last)
}

// ephemeralRange is the kernel's range of source ports for outgoing connections.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	var l, h int
	if n, _ := fmt.Sscanf(string(b), "%d %d", &l, &h); n == 2 && l > 0 && h >= l {
		return l, h
	}
	return lo, hi
}
