package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cgroupNameRE is one cgroup path segment.
var cgroupNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// withCgroupParent puts the container's cgroup under the tenants' parent.
func withCgroupParent(parent string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, c *containers.Container, s *specs.Spec) error {
		setLinux(s)
		s.Linux.CgroupsPath = path.Join("/", parent, c.ID)
		return nil
	}
}

// limitTenants makes the tenants' parent cgroup in the pids hierarchy (before
// runc makes it for the first container, with no limit) and writes its
// pids.max: on cgroup v2 with the pids controller enabled for the root's
// children, on v1 (and hybrid) in the pids hierarchy. A limit already there is
// written again: the setting may have changed.
func (cfg Config) limitTenants() error {
	dir, err := tenantsPidsDir(cfg.CgroupParent)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("tenants' cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(cfg.TenantsPidsMax, 10)), 0o644); err != nil {
		return fmt.Errorf("tenants' cgroup: pids limit: %w", err)
	}
	return nil
}

// tenantsPidsDir is the tenants' cgroup's directory in the hierarchy that has
// the pids controller; on cgroup v2 the controller is enabled for the root's
// children first (runc would enable it when it makes the first container's
// cgroup; the parent's pids.max exists only once it is).
func tenantsPidsDir(parent string) (string, error) {
	if b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		if !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " pids ") {
			return "", errors.New("tenants' cgroup: the pids controller is not available on cgroup v2 (cgroup.controllers)")
		}
		sub := filepath.Join(cgroupRoot, "cgroup.subtree_control")
		if b, err := os.ReadFile(sub); err != nil || !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " pids ") {
			if err := os.WriteFile(sub, []byte("+pids"), 0o644); err != nil {
				return "", fmt.Errorf("tenants' cgroup: enable pids: %w", err)
			}
		}
		return filepath.Join(cgroupRoot, parent), nil
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "pids")); err != nil {
		return "", fmt.Errorf("tenants' cgroup: no pids hierarchy: %w", err)
	}
	return filepath.Join(cgroupRoot, "pids", parent), nil
}
