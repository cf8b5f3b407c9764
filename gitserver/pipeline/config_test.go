package pipeline_test

import (
	"strings"
	"testing"

	"bex.co/bex/gitserver/pipeline"
)

func TestConfigValidate(t *testing.T) {
	cfg := pipeline.DefaultConfig()
	cfg.StateDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.MaxConcurrentBuilds = 0
	cfg.BuildTimeout = -1
	cfg.MaxPushObjects = 0
	err := cfg.Validate()
	for _, want := range []string{"Config.MaxConcurrentBuilds", "Config.BuildTimeout", "Config.MaxPushObjects"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to name %s", err, want)
		}
	}
	// Without a state dir, every path it would give is named.
	err = pipeline.DefaultConfig().Validate()
	for _, want := range []string{"Config.ReposDir", "Config.UpstreamKnownHosts"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate without StateDir = %v, want it to name %s", err, want)
		}
	}
}
