package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"bex.co/bex/internal/baseimage"
)

// seedRegistry pushes the busybox base (Debian's busybox-static, packed as bex up
// packs it) into bex's registry as docker.io/library/busybox:latest. buildkitd
// takes docker.io from that registry (its mirror, bexPatches), so `FROM busybox`
// builds on the cluster as it does on one machine, where nothing can be pulled
// from Docker Hub. Through the registry's node port, from the host.
func (l *layout) seedRegistry(ctx context.Context) error {
	img, err := baseimage.BusyboxImage("/bin/busybox")
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(fmt.Sprintf("%s:%d/library/busybox:latest", l.nodeIP, registryNodePort), name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push busybox to the registry at %s: %w", ref.Context().RegistryStr(), err)
	}
	say("busybox base pushed to the registry (FROM busybox builds from it)")
	return nil
}
