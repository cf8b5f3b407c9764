package builder_test

import (
	"path/filepath"
	"strings"
	"testing"

	"bex.co/bex/builder"
)

// TestConfigValidate: the defaults with a state dir are valid, and a config with
// several problems is refused with every one of them, each by its field.
func TestConfigValidate(t *testing.T) {
	cfg := builder.DefaultConfig()
	cfg.StateDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.Address, cfg.ImageResolveMode, cfg.MaxConcurrent, cfg.KeepLogs = "/run/buildkit.sock", "always", 0, 0
	cfg.StepCgroup, cfg.Plan.Images.Go = "relative/cgroup", ""
	cfg.MinFreeBytes, cfg.MinFreePercent = -1, 101
	err := cfg.Validate()
	for _, want := range []string{"Config.Address", "Config.ImageResolveMode", "Config.MaxConcurrent", "Config.KeepLogs",
		"Config.StepCgroup", "Config.Plan: plan: Config.Images.Go", "Config.MinFreeBytes", "Config.MinFreePercent"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	// Without a state dir, every path it would give is named.
	err = builder.DefaultConfig().Validate()
	for _, want := range []string{"Config.Address", "Config.WorkDir", "Config.LogDir"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate without StateDir = %v, want it to name %s", err, want)
		}
	}
	// The paths a state dir gives can each be set on their own.
	cfg = builder.DefaultConfig()
	dir := t.TempDir()
	cfg.Address, cfg.WorkDir, cfg.LogDir = "unix:///run/buildkit/buildkitd.sock", filepath.Join(dir, "w"), filepath.Join(dir, "l")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("explicit paths without a state dir: %v", err)
	}
	// TLS: on a tcp:// address only, with a CA, a certificate with its key.
	cfg.TLS = builder.TLSConfig{Cert: "/tls/cert.pem"}
	err = cfg.Validate()
	for _, want := range []string{"Config.TLS: buildkitd speaks TLS on a tcp:// address only", "Config.TLS.CA: required", "Config.TLS.Cert and Config.TLS.Key: both or neither"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate with TLS on a unix socket, no CA, no key = %v, want it to name %s", err, want)
		}
	}
	cfg.Address = "tcp://bex-buildkitd.bex-system.svc.cluster.local:1234"
	cfg.TLS = builder.TLSConfig{CA: "/tls/ca.pem", Cert: "/tls/cert.pem", Key: "/tls/key.pem"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("mutual TLS on tcp: %v", err)
	}
}
