package daemons

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bkclient "github.com/moby/buildkit/client"
)

// RUN steps share the host's network: there is no CNI on a bex node, and builds
// that fetch dependencies need the network the host has.
const buildkitdConfig = `root = %[1]q

[grpc]
  address = [%[2]q]

[worker.oci]
  enabled = false

[worker.containerd]
  enabled = true
  address = %[3]q
  namespace = %[4]q
  networkMode = "host"
  gc = true
`

// buildkitdOCIConfig is the configuration without containerd: the OCI worker
// (runc, overlayfs snapshots under root), for builds whose result is exported
// rather than run here (`make image`).
const buildkitdOCIConfig = `root = %[1]q

[grpc]
  address = [%[2]q]

[worker.oci]
  enabled = true
  networkMode = "host"
  gc = true

[worker.containerd]
  enabled = false
`

// Buildkitd is a buildkitd whose containerd worker builds into the containerd at
// ContainerdAddress, in containerd namespace Namespace, with its state under Dir.
// Without a ContainerdAddress it uses its OCI worker and keeps images to itself.
type Buildkitd struct {
	Dir               string
	ContainerdAddress string
	Namespace         string
	// HTTPRegistries are registries (host:port) reached over plain HTTP, such as a
	// test registry on loopback.
	HTTPRegistries []string
	// CgroupParent is the cgroup build steps run under (BuildCgroup.Name), which
	// holds their memory limit; empty: buildkitd's default, no limit.
	CgroupParent string
}

// Address is its gRPC address, "unix://<path>".
func (b Buildkitd) Address() string { return "unix://" + filepath.Join(b.Dir, "buildkitd.sock") }

// WriteConfig writes buildkitd.toml and returns the daemon's arguments.
func (b Buildkitd) WriteConfig() ([]string, error) {
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return nil, err
	}
	config := filepath.Join(b.Dir, "buildkitd.toml")
	var content strings.Builder
	if b.ContainerdAddress == "" {
		fmt.Fprintf(&content, buildkitdOCIConfig, filepath.Join(b.Dir, "root"), b.Address())
	} else {
		fmt.Fprintf(&content, buildkitdConfig, filepath.Join(b.Dir, "root"), b.Address(), b.ContainerdAddress, b.Namespace)
	}
	for _, host := range b.HTTPRegistries {
		fmt.Fprintf(&content, "\n[registry.%q]\n  http = true\n", host)
	}
	text := withCgroupParent(content.String(), b.ContainerdAddress != "", b.CgroupParent)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		return nil, err
	}
	// Without --otel-socket-path buildkitd creates /run/buildkit/otel-grpc.sock,
	// which two daemons on one machine would fight over.
	return []string{"--config", config, "--otel-socket-path", filepath.Join(b.Dir, "otel.sock")}, nil
}

// Ready succeeds once the daemon answers with a worker.
func (b Buildkitd) Ready(ctx context.Context) error {
	cl, err := bkclient.New(ctx, b.Address())
	if err != nil {
		return err
	}
	defer cl.Close()
	workers, err := cl.ListWorkers(ctx)
	if err != nil {
		return err
	}
	if len(workers) == 0 {
		return errors.New("no workers yet")
	}
	return nil
}
