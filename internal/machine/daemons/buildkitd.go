package daemons

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bkclient "github.com/moby/buildkit/client"

	"bex.co/bex/internal/machine/tenantnet"
)

// RUN steps run on the network networkConfig says: a network namespace of their
// own on the builds' CNI network, or the host's.
const buildkitdConfig = `root = %[1]q

[grpc]
  address = [%[2]q]

[worker.oci]
  enabled = false

[worker.containerd]
  enabled = true
  address = %[3]q
  namespace = %[4]q
%[5]s  gc = true
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
	// TenantNet, when set, runs the containerd worker's RUN steps each in a
	// network namespace of its own on the builds' network (internal/machine/tenantnet),
	// where they reach neither the host's listeners nor the apps. Unset: the
	// host's network. Start from tenantnet.DefaultConfig(): its PluginDir is
	// written to buildkitd's configuration as it is.
	TenantNet *tenantnet.Config
	// CacheMaxBytes bounds the build cache: buildkitd's GC, after builds, removes
	// the least recently used records past it (gcPolicy). 0: buildkitd's default
	// policy (a share of its disk, 60 days).
	CacheMaxBytes int64
	// CacheKeep, with CacheMaxBytes, is how long a record nobody uses is kept
	// whatever the cache's size; 0: kept while the cache is under CacheMaxBytes.
	CacheKeep time.Duration
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
		network, err := b.networkConfig()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&content, buildkitdConfig, filepath.Join(b.Dir, "root"), b.Address(), b.ContainerdAddress, b.Namespace, network)
	}
	section := "worker.oci"
	if b.ContainerdAddress != "" {
		section = "worker.containerd"
	}
	content.WriteString(gcPolicy(section, b.CacheMaxBytes, b.CacheKeep))
	for _, host := range b.HTTPRegistries {
		fmt.Fprintf(&content, "\n[registry.%q]\n  http = true\n", host)
	}
	text := withCgroupParent(content.String(), b.ContainerdAddress != "", b.CgroupParent)
	if err := os.WriteFile(config, []byte(text), 0o600); err != nil {
		return nil, err
	}
	// Without --otel-socket-path buildkitd creates /run/buildkit/otel-grpc.sock,
	// which two daemons on one machine would fight over.
	return []string{"--config", config, "--otel-socket-path", filepath.Join(b.Dir, "otel.sock")}, nil
}

// cniPoolSize is how many namespaces buildkitd keeps ready for RUN steps: a few,
// as builds take build slots and this machine runs few at once; each holds an
// address of the builds' subnet while it waits.
const cniPoolSize = 4

// networkConfig writes the builds' CNI configuration (with TenantNet) and returns
// the network lines of the containerd worker's section.
func (b Buildkitd) networkConfig() (string, error) {
	if b.TenantNet == nil {
		return "  networkMode = \"host\"\n", nil
	}
	cfg := *b.TenantNet
	if err := cfg.Validate(); err != nil {
		return "", fmt.Errorf("builds network: %w", err)
	}
	if err := cfg.CheckPlugins(); err != nil {
		return "", err
	}
	path := filepath.Join(b.Dir, "cni", tenantnet.BuildsNetwork+".conflist")
	if err := cfg.WriteBuildsConfList(path); err != nil {
		return "", err
	}
	return fmt.Sprintf("  networkMode = \"cni\"\n  cniConfigPath = %q\n  cniBinaryPath = %q\n  cniPoolSize = %d\n",
		path, cfg.PluginDir, cniPoolSize), nil
}

// InstallNetwork installs the tenants' filter rules (tenantnet.Install) and
// releases attachments whose namespaces are gone (tenantnet.ReleaseStale) when
// TenantNet is set; call it before the daemon starts, so that no RUN step ever
// runs without the rules.
func (b Buildkitd) InstallNetwork(ctx context.Context) error {
	if b.TenantNet == nil {
		return nil
	}
	if err := tenantnet.Install(ctx, *b.TenantNet); err != nil {
		return err
	}
	// A buildkitd killed before it released its pool left addresses allocated.
	return tenantnet.ReleaseStale(ctx, *b.TenantNet)
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
