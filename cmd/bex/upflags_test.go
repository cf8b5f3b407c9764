package main

import (
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder/plan"
)

// The build cache's flags, as bex up reads them: a size in the byteSize syntax and a
// duration; without them, no size (bex up measures the default at start) and 168h.
func TestUpBuildCacheFlags(t *testing.T) {
	c := &upCmd{}
	cmd := c.command()
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if c.buildCache != 0 || c.cfg.BuildCacheKeep != 168*time.Hour {
		t.Errorf("defaults: size %d, keep %s", c.buildCache, c.cfg.BuildCacheKeep)
	}
	c = &upCmd{}
	cmd = c.command()
	if err := cmd.ParseFlags([]string{"--build-cache-size", "20GiB", "--build-cache-keep", "72h"}); err != nil {
		t.Fatal(err)
	}
	if c.buildCache != 20<<30 || c.cfg.BuildCacheKeep != 72*time.Hour {
		t.Errorf("set: size %d, keep %s", c.buildCache, c.cfg.BuildCacheKeep)
	}
	c = &upCmd{}
	cmd = c.command()
	if err := cmd.ParseFlags([]string{"--build-cache-size", "-1"}); err == nil || !strings.Contains(err.Error(), "build-cache-size") {
		t.Errorf("a negative size: %v", err)
	}
}

// The plans' base images, as bex gitserver reads them: the official images by
// default (production), and what --plan-image-* names (bex up --local-bases passes
// the stand-ins).
func TestGitserverPlanImageFlags(t *testing.T) {
	c := &gitserverCmd{}
	cmd := c.command()
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if c.planImages != plan.DefaultConfig().Images {
		t.Errorf("defaults: %+v, want the official images %+v", c.planImages, plan.DefaultConfig().Images)
	}
	c = &gitserverCmd{}
	cmd = c.command()
	if err := cmd.ParseFlags([]string{"--plan-image-node", "bex-base.local/node:bookworm", "--plan-image-runtime", "bex-base.local/static:bookworm"}); err != nil {
		t.Fatal(err)
	}
	if c.planImages.Node != "bex-base.local/node:bookworm" || c.planImages.Runtime != "bex-base.local/static:bookworm" || c.planImages.Go != plan.DefaultConfig().Images.Go {
		t.Errorf("set: %+v", c.planImages)
	}
}

// --allow-tenant-egress, as bex up, the deployer and the gitserver read it (each
// installs the tenants' rules, so each must be given the same ranges): none by
// default, the ranges given (twice: both), and bad input refused in one line
// that names the flag.
func TestAllowTenantEgressFlag(t *testing.T) {
	type cmd interface {
		Parse([]string) error
	}
	up, dep, git := &upCmd{}, &deployerCmd{}, &gitserverCmd{}
	for _, c := range []struct {
		name string
		cmd  cmd
		got  *egressFlag
	}{{"up", up.command().Flags(), &up.allowEgress}, {"deployer", dep.command().Flags(), &dep.allowEgress}, {"gitserver", git.command().Flags(), &git.allowEgress}} {
		if len(*c.got) != 0 {
			t.Errorf("%s: default %v, want none", c.name, *c.got)
		}
		if err := c.cmd.Parse([]string{"--allow-tenant-egress", "192.168.1.0/24,10.0.5.7", "--allow-tenant-egress", "100.64.1.0/24"}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.got.String() != "192.168.1.0/24,10.0.5.7/32,100.64.1.0/24" {
			t.Errorf("%s: --allow-tenant-egress gave %s", c.name, c.got)
		}
	}
	err := (&upCmd{}).command().ParseFlags([]string{"--allow-tenant-egress", "192.168.1.0/24,fd00::/8"})
	if err == nil || !strings.Contains(err.Error(), "allow-tenant-egress") || !strings.Contains(err.Error(), "want IPv4 CIDRs") || strings.Contains(err.Error(), "\n") {
		t.Errorf("an IPv6 range: %v", err)
	}
}

// --runc names the runc the containers run with; without it bex up looks next to
// the bex binary and in PATH (Preflight).
func TestUpRuncFlag(t *testing.T) {
	c := &upCmd{}
	cmd := c.command()
	if err := cmd.ParseFlags(nil); err != nil || c.cfg.Runc != "" {
		t.Fatalf("default %q, %v", c.cfg.Runc, err)
	}
	c = &upCmd{}
	cmd = c.command()
	if err := cmd.ParseFlags([]string{"--runc", "/opt/runc/runc"}); err != nil || c.cfg.Runc != "/opt/runc/runc" {
		t.Fatalf("set %q, %v", c.cfg.Runc, err)
	}
}
