package up

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/testenv"
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
		"log format":        {func(c *Config) { c.LogFormat = "yaml" }, "--log-format"},
		"resolve mode":      {func(c *Config) { c.ImageResolveMode = "always" }, "--image-resolve-mode"},
		"tiny build cache":  {func(c *Config) { c.BuildCacheBytes = 1 << 20 }, "--build-cache-size"},
		"negative keep":     {func(c *Config) { c.BuildCacheKeep = -time.Hour }, "--build-cache-keep"},
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

// TestConfigValidateSaysEveryProblem: one run of bex up with several bad flags
// names them all, not the first only.
func TestConfigValidateSaysEveryProblem(t *testing.T) {
	c := validConfig()
	c.StateDir, c.SSHAddr, c.HooksAddr, c.BaseDomain, c.BuildMemory, c.Bex = "", "2222", "nope", "a/b", 1, ""
	err := c.Validate()
	for _, want := range []string{"--state-dir", "--ssh-addr", "--hooks-addr", "--base-domain", "--build-memory", "Config.Bex"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	d := DefaultConfig()
	d.Bex, d.Out = "/usr/local/bin/bex", &bytes.Buffer{}
	if err := d.Validate(); err != nil {
		t.Errorf("the flags' defaults: %v", err)
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

// TestChildrenAreToldByFlagsOnly: a child's settings are its command line
// (--log-format among them); the BEX_* variables bex up was started with are not
// passed on, as they would set the child's flags of the same name. The e2e test
// TestUpLogFormatReachesEveryChild checks the children's real output.
func TestChildrenAreToldByFlagsOnly(t *testing.T) {
	cfg := validConfig()
	cfg.LogFormat = "json"
	p := &Platform{cfg: cfg, kubeconfig: "/state/kubeconfig"}
	proc := p.component("edge", []string{"--http-addr", ":80"}, nil)
	if !strings.Contains(strings.Join(proc.Args, " "), "--log-format json") || proc.Args[0] != "edge" {
		t.Errorf("edge's args %q do not carry --log-format json", proc.Args)
	}
	for kv, keep := range map[string]bool{"BEX_LOG_FORMAT=text": false, "BEX_BASE_DOMAIN=x": false, "KUBECONFIG=/x": false, "PATH=/bin": true} {
		if proc.KeepEnv(kv) != keep {
			t.Errorf("KeepEnv(%q) = %v, want %v", kv, !keep, keep)
		}
	}
}

// TestGoMemoryReachesEveryProcess: bex's components get their Go memory settings as
// flags (their command line is all they are told), the other programs as the Go
// runtime's variables; a process without a setting is left as it is.
func TestGoMemoryReachesEveryProcess(t *testing.T) {
	cfg := validConfig()
	p := &Platform{cfg: cfg, kubeconfig: "/state/kubeconfig"}
	for _, name := range []string{"deployer", "edge", "gitserver"} {
		proc := p.withGoMemory(p.component(name, nil, nil))
		args := strings.Join(proc.Args, " ")
		m := goMemoryOf[name]
		if !strings.Contains(args, fmt.Sprintf("--go-memory-limit %d --go-gc-percent %d", m.limit, m.gcPercent)) {
			t.Errorf("%s's args %q lack its Go memory flags", name, args)
		}
		if slices.ContainsFunc(proc.Env, func(kv string) bool { return strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GOGC=") }) {
			t.Errorf("%s is told by its environment too: %q", name, proc.Env)
		}
	}
	for _, name := range []string{"etcd", "kube-apiserver", "containerd", "buildkitd"} {
		proc := p.withGoMemory(supervise.Process{Name: name, Path: "/bin/" + name, Env: []string{"PATH=/bin"}})
		m := goMemoryOf[name]
		want := []string{"PATH=/bin", fmt.Sprintf("GOMEMLIMIT=%d", m.limit), fmt.Sprintf("GOGC=%d", m.gcPercent)}
		if !slices.Equal(proc.Env, want) {
			t.Errorf("%s's environment is %q, want %q", name, proc.Env, want)
		}
	}
	other := supervise.Process{Name: "busybox", Path: "/bin/busybox", Args: []string{"x"}}
	if got := p.withGoMemory(other); !slices.Equal(got.Args, other.Args) || got.Env != nil {
		t.Errorf("a process without a setting was changed: %+v", got)
	}
}

// TestGoMemoryDefaultsLeaveEveryProcessAlone: with --go-memory-defaults (the
// benchmark's baseline) no process gets a Go memory flag or variable.
func TestGoMemoryDefaultsLeaveEveryProcessAlone(t *testing.T) {
	cfg := validConfig()
	cfg.GoMemoryDefaults = true
	p := &Platform{cfg: cfg, kubeconfig: "/state/kubeconfig"}
	for _, name := range []string{"deployer", "edge", "gitserver"} {
		proc := p.component(name, nil, nil)
		if got := p.withGoMemory(proc); !slices.Equal(got.Args, proc.Args) {
			t.Errorf("%s's args became %q, want %q", name, got.Args, proc.Args)
		}
	}
	for _, name := range []string{"etcd", "kube-apiserver", "containerd", "buildkitd"} {
		proc := supervise.Process{Name: name, Path: "/bin/" + name, Env: []string{"PATH=/bin"}}
		if got := p.withGoMemory(proc); !slices.Equal(got.Env, proc.Env) {
			t.Errorf("%s's environment became %q", name, got.Env)
		}
	}
}

// TestBuildCacheBound: without --build-cache-size buildkitd gets the default
// measured on the state dir's own file system; with it, the flag's size; the keep
// duration goes with either.
func TestBuildCacheBound(t *testing.T) {
	p := &Platform{cfg: validConfig()}
	p.cfg.StateDir, p.cfg.BuildCacheKeep = t.TempDir(), 72*time.Hour
	want, err := daemons.DefaultBuildCacheBytes(p.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	var b daemons.Buildkitd
	if err := p.boundBuildCache(&b); err != nil {
		t.Fatal(err)
	}
	if b.CacheMaxBytes != want || want <= 0 || b.CacheKeep != 72*time.Hour {
		t.Errorf("default: %d bytes, keep %s; want %d, 72h", b.CacheMaxBytes, b.CacheKeep, want)
	}
	p.cfg.BuildCacheBytes = 3 << 30
	if err := p.boundBuildCache(&b); err != nil || b.CacheMaxBytes != 3<<30 {
		t.Errorf("--build-cache-size 3GiB: %d, %v", b.CacheMaxBytes, err)
	}
	p.cfg.BuildCacheBytes, p.cfg.StateDir = 0, filepath.Join(p.cfg.StateDir, "missing")
	if err := p.boundBuildCache(&b); err == nil || !strings.Contains(err.Error(), "--build-cache-size") {
		t.Errorf("a state dir that cannot be measured: %v", err)
	}
}

// TestEgressArgs: the deployer and the gitserver, which install the tenants'
// rules too, are given bex up's --allow-tenant-egress as it is, and nothing
// without it.
func TestEgressArgs(t *testing.T) {
	p := &Platform{cfg: validConfig()}
	if got := p.egressArgs(); got != nil {
		t.Errorf("without ranges: %q", got)
	}
	p.cfg.AllowTenantEgress = []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("10.0.5.7/32")}
	if got := p.egressArgs(); !slices.Equal(got, []string{"--allow-tenant-egress", "192.168.1.0/24,10.0.5.7/32"}) {
		t.Errorf("with ranges: %q", got)
	}
}

// TestPushBoundArgs: bex up's bounds of a push reach the gitserver, and a bound
// left at 0 leaves the gitserver's default alone.
func TestPushBoundArgs(t *testing.T) {
	p := &Platform{cfg: validConfig()}
	if got := p.pushBoundArgs(); got != nil {
		t.Errorf("defaults: %q", got)
	}
	p.cfg.MaxObjectBytes, p.cfg.MaxPushObjects, p.cfg.MinFreeDiskBytes = 1<<20, 5000, 1<<30
	want := []string{"--max-object-size", "1048576", "--max-push-objects", "5000", "--min-free-disk", "1073741824"}
	if got := p.pushBoundArgs(); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	p.cfg.MaxPushObjects = -1
	if err := p.cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--max-push-objects") {
		t.Errorf("a negative --max-push-objects: %v", err)
	}
}

// bex up says which runc runs the containers, with its version, and refuses
// Debian 12's (1.1.5, without the 2025 fixes) in one line that says how to get a
// newer: the real runc of `make tools` and the real Debian one.
func TestCheckRuncSaysWhichAndRefusesAnOldOne(t *testing.T) {
	runc, err := testenv.Binary("runc")
	if err != nil {
		t.Fatal(err)
	}
	cfg := validConfig()
	out, err := checkRunc(cfg, Binaries{"runc": runc})
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "runc 1.") || !strings.Contains(lines[0], runc) {
		t.Fatalf("said: %q", out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	const debian = "/usr/sbin/runc" // Debian 12's package, which containerd's depends on
	_, err = checkRunc(cfg, Binaries{"runc": debian})
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), "--runc") {
		t.Fatalf("Debian's runc: %v", err)
	}
	t.Logf("refused: %v", err)
}

// --runc wins over the runc next to bex, and one that is not there is named.
func TestPreflightTakesRuncFlag(t *testing.T) {
	dir := t.TempDir()
	for _, p := range programs {
		if err := os.WriteFile(filepath.Join(dir, p.name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", filepath.Join(dir, "nothing-here"))
	c := validConfig()
	c.Bex = filepath.Join(dir, "bex")
	c.Runc = filepath.Join(dir, "buildkitd") // any executable file
	bins, err := Preflight(c)
	if err != nil || bins["runc"] != c.Runc {
		t.Fatalf("runc %q, %v", bins["runc"], err)
	}
	c.Runc = filepath.Join(dir, "no-runc")
	if _, err := Preflight(c); err == nil || !strings.Contains(err.Error(), "--runc "+c.Runc) || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("missing --runc: %v", err)
	}
}
