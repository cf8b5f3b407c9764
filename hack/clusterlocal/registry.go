package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"bex.co/bex/internal/machine/baseimage"
)

// seedRegistry pushes the busybox base (Debian's busybox-static, packed as bex up
// packs it) into bex's registry as docker.io/library/busybox:latest. buildkitd
// takes docker.io from that registry (its mirror, bexPatches), so `FROM busybox`
// builds on the cluster as it does on one machine, where nothing can be pulled
// from Docker Hub. Through the registry's node port, from the host, as the
// registry's user builder (its credentials from the Secret install-bex.sh made):
// the registry takes nothing without credentials.
func (l *layout) seedRegistry(ctx context.Context, k kubectl) error {
	img, err := baseimage.BusyboxImage("/bin/busybox")
	if err != nil {
		return err
	}
	auth, err := builderAuth(k)
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(fmt.Sprintf("%s:%d/library/busybox:latest", l.nodeIP, registryNodePort), name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
		return fmt.Errorf("push busybox to the registry at %s: %w", ref.Context().RegistryStr(), err)
	}
	say("busybox base pushed to the registry (FROM busybox builds from it)")
	return nil
}

// builderAuth is the registry's user builder, from the gitserver's Docker
// config.json in the Secret bex-system/bex-registry-builder.
func builderAuth(k kubectl) (authn.Authenticator, error) {
	out, err := k("", "-n", "bex-system", "get", "secret", "bex-registry-builder", "-o", `jsonpath={.data.config\.json}`)
	if err != nil {
		return nil, err
	}
	raw, err := decodeBase64(out)
	if err != nil {
		return nil, fmt.Errorf("the Secret bex-registry-builder: %w", err)
	}
	cf, err := dockerconfig.LoadFromReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("the Secret bex-registry-builder: %w", err)
	}
	ac, err := cf.GetAuthConfig(registryHost)
	if err != nil || ac.Username == "" {
		return nil, fmt.Errorf("the Secret bex-registry-builder has no credentials for %s (%v)", registryHost, err)
	}
	return &authn.Basic{Username: ac.Username, Password: ac.Password}, nil
}
