package up

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func validConfig() Config {
	return Config{StateDir: "/var/lib/bex", SSHAddr: ":2222", HTTPAddr: ":80", HTTPSAddr: ":443",
		BaseDomain: "localhost", Bex: "/usr/local/bin/bex", Out: &bytes.Buffer{}}
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, tc := range map[string]struct {
		change func(*Config)
		want   string
	}{
		"no state dir":      {func(c *Config) { c.StateDir = "" }, "--state-dir"},
		"ssh addr no port":  {func(c *Config) { c.SSHAddr = "2222" }, "--ssh-addr"},
		"http addr garbage": {func(c *Config) { c.HTTPAddr = "localhost" }, "--http-addr"},
		"https addr empty":  {func(c *Config) { c.HTTPSAddr = "" }, "--https-addr"},
		"domain with port":  {func(c *Config) { c.BaseDomain = "example.com:443" }, "--base-domain"},
		"empty domain":      {func(c *Config) { c.BaseDomain = "" }, "--base-domain"},
	} {
		t.Run(name, func(t *testing.T) {
			c := validConfig()
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestAddresses(t *testing.T) {
	for addr, want := range map[string]string{":2222": "127.0.0.1:2222", "0.0.0.0:80": "127.0.0.1:80", "127.0.0.2:8443": "127.0.0.2:8443", "[::]:22": "127.0.0.1:22"} {
		if got := dialable(addr); got != want {
			t.Errorf("dialable(%q) = %q, want %q", addr, got, want)
		}
	}
	p := &Platform{cfg: validConfig()}
	p.cfg.SSHAddr = "127.0.0.1:2222"
	if got := p.SSHURL(); got != "ssh://git@127.0.0.1:2222" {
		t.Errorf("SSHURL = %q", got)
	}
	p.cfg.SSHAddr = ":22"
	host, _ := os.Hostname()
	if got := p.SSHURL(); got != "ssh://git@"+host+":22" {
		t.Errorf("SSHURL on every address = %q, want the machine's name", got)
	}
}

// Programs are found next to bex before PATH, as `make tools` leaves them in bin/.
func TestPreflightFindsProgramsNextToBex(t *testing.T) {
	dir := t.TempDir()
	for _, p := range programs {
		if err := os.WriteFile(filepath.Join(dir, p.name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", filepath.Join(dir, "nothing-here"))
	c := validConfig()
	c.Bex = filepath.Join(dir, "bex")
	bins, err := Preflight(c)
	if err != nil {
		t.Fatal(err)
	}
	if bins["buildkitd"] != filepath.Join(dir, "buildkitd") {
		t.Fatalf("buildkitd found at %q", bins["buildkitd"])
	}
	// With a containerd given, containerd is not needed.
	if err := os.Remove(filepath.Join(dir, "containerd")); err != nil {
		t.Fatal(err)
	}
	c.ContainerdAddr = "/run/containerd/containerd.sock"
	if _, err := Preflight(c); err != nil {
		t.Fatalf("with --containerd-addr: %v", err)
	}
	c.ContainerdAddr = ""
	if _, err := Preflight(c); err == nil || !strings.Contains(err.Error(), "apt-get install containerd") {
		t.Fatalf("without containerd: %v", err)
	}
}
