package testenv

import (
	"context"
	"os"
	"testing"
	"time"

	"bex.co/bex/internal/machine/baseimage"
)

// BusyboxRef is the name the busybox base image gets in containerd.
const BusyboxRef = baseimage.BusyboxRef

// BusyboxImage imports Debian's static busybox into c as BusyboxRef (see
// baseimage.ImportBusybox) and returns the manifest digest.
func BusyboxImage(ctx context.Context, c *Containerd, dir string) (string, error) {
	bin, err := Binary("busybox")
	if err != nil {
		return "", err
	}
	cl, err := c.Client()
	if err != nil {
		return "", err
	}
	defer cl.Close()
	return baseimage.ImportBusybox(ctx, cl, bin, dir)
}

// SharedBusybox imports the busybox base into SharedContainerd on first use and
// returns its manifest digest.
func SharedBusybox(t testing.TB) string {
	t.Helper()
	c := SharedContainerd(t)
	return Shared(t, "busybox", func(dir string) (string, func() error, error) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d, err := BusyboxImage(ctx, c, dir)
		return d, func() error { return nil }, err
	})
}
