package kube

import (
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.Port != 8080 || c.ProgressDeadlineSeconds != 60 || c.MaxSurge != 1 || c.TerminationGracePeriodSeconds != 30 ||
		c.DrainSeconds != 5 || c.FieldManager != "bex-deployer" || c.ImagePullSecret != "" {
		t.Fatalf("defaults %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Set fields are kept.
	c = Config{Port: 5000, ProgressDeadlineSeconds: 120, MaxSurge: 3, TerminationGracePeriodSeconds: 10, DrainSeconds: -1, ImagePullSecret: "regcred"}.withDefaults()
	if c.Port != 5000 || c.ProgressDeadlineSeconds != 120 || c.MaxSurge != 3 || c.TerminationGracePeriodSeconds != 10 || c.DrainSeconds != -1 {
		t.Fatalf("kept %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"port too big", func(c *Config) { c.Port = 70000 }, "port 70000"},
		{"negative port", func(c *Config) { c.Port = -1 }, "port -1"},
		{"no surge", func(c *Config) { c.MaxSurge = -1 }, "max surge"},
		{"negative deadline", func(c *Config) { c.ProgressDeadlineSeconds = -5 }, "progress deadline"},
		{"drain as long as the grace period", func(c *Config) { c.DrainSeconds = 30 }, "drain 30s"},
		{"bad pull secret", func(c *Config) { c.ImagePullSecret = "Not_A_Name" }, "image pull secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tt.want)
			}
			if _, err := New(c, nil); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestEscapeEnvValue(t *testing.T) {
	for in, want := range map[string]string{
		"plain":    "plain",
		"a$b":      "a$$b",
		"$(HOME)":  "$$(HOME)",
		"pa$$word": "pa$$$$word",
		"":         "",
	} {
		if got := escapeEnvValue(in); got != want {
			t.Errorf("escapeEnvValue(%q) = %q, want %q", in, got, want)
		}
	}
}
