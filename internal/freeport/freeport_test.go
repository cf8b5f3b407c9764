package freeport

import (
	"fmt"
	"net"
	"testing"
)

func TestLoopbackIsFreeAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange()
	for range 50 {
		p, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if p >= lo && p <= hi {
			t.Fatalf("port %d is in the ephemeral range %d-%d", p, lo, hi)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}
