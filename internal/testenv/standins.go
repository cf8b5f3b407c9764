package testenv

import (
	"context"
	"os"
	"testing"
	"time"

	"bex.co/bex/internal/machine/baseimage"
)

// StandInsConfig is the stand-ins' configuration the tests use: the defaults, in
// the machine's cache (BEX_BASEIMAGE_CACHE overrides baseimage.DefaultCacheDir),
// so that every test run and every fresh clone on this machine builds them once.
func StandInsConfig() baseimage.Config {
	cfg := baseimage.DefaultConfig()
	if dir := os.Getenv("BEX_BASEIMAGE_CACHE"); dir != "" {
		cfg.CacheDir = dir
	}
	if bin, err := Binary("mmdebstrap"); err == nil {
		cfg.Mmdebstrap = bin
	}
	return cfg
}

// SharedStandIns builds (or finds in the cache) the Debian stand-ins for the
// plans' official bases and imports them into SharedContainerd on first use; it
// returns them. The first build on a machine takes minutes.
func SharedStandIns(t testing.TB) []baseimage.Image {
	t.Helper()
	c := SharedContainerd(t)
	return Shared(t, "standins", func(dir string) ([]baseimage.Image, func() error, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		cl, err := c.Client()
		if err != nil {
			return nil, nil, err
		}
		defer cl.Close()
		imgs, err := baseimage.Import(ctx, cl, StandInsConfig())
		return imgs, func() error { return nil }, err
	})
}
