package daemons

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestBuildkitdConfigNamesTheCgroupParentOfTheEnabledWorker(t *testing.T) {
	for _, containerd := range []bool{true, false} {
		b := Buildkitd{Dir: t.TempDir(), Namespace: "bex", CgroupParent: "bex-builds-0123abcd", HTTPRegistries: []string{"127.0.0.1:5000"}}
		if containerd {
			b.ContainerdAddress = "/run/containerd.sock"
		}
		if _, err := b.WriteConfig(); err != nil {
			t.Fatal(err)
		}
		// Decoded into the keys of buildkitd's own config (cmd/buildkitd/config).
		var cfg struct {
			Worker struct {
				OCI struct {
					Enabled             bool   `toml:"enabled"`
					DefaultCgroupParent string `toml:"defaultCgroupParent"`
				} `toml:"oci"`
				Containerd struct {
					Enabled             bool   `toml:"enabled"`
					DefaultCgroupParent string `toml:"defaultCgroupParent"`
				} `toml:"containerd"`
			} `toml:"worker"`
		}
		data, err := os.ReadFile(filepath.Join(b.Dir, "buildkitd.toml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := toml.Unmarshal(data, &cfg); err != nil {
			t.Fatalf("%v\n%s", err, data)
		}
		got, other := cfg.Worker.OCI.DefaultCgroupParent, cfg.Worker.Containerd.DefaultCgroupParent
		if containerd {
			got, other = other, got
		}
		if other != "" || cfg.Worker.OCI.Enabled == containerd || cfg.Worker.Containerd.Enabled != containerd {
			t.Errorf("containerd worker %v: the other worker's section changed: %+v", containerd, cfg)
		}
		if got != b.CgroupParent {
			t.Errorf("containerd worker %v: defaultCgroupParent %q", containerd, got)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// TestBuildCgroupOnThisMachine makes a real build cgroup on this machine's memory
// controller (cgroup v1 here, v2 elsewhere) and reads its limit back.
func TestBuildCgroupOnThisMachine(t *testing.T) {
	c := BuildCgroupFor(t.TempDir(), 96<<20)
	if err := c.Setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Remove() })
	if c.Unified() {
		if got := readFile(t, filepath.Join(c.Dir(), "memory.max")); got != "100663296" {
			t.Fatalf("memory.max %s", got)
		}
	} else {
		if got := readFile(t, filepath.Join(c.Dir(), "memory.limit_in_bytes")); got != "100663296" {
			t.Fatalf("memory.limit_in_bytes %s", got)
		}
		if sw := filepath.Join(c.Dir(), "memory.memsw.limit_in_bytes"); fileExists(sw) && readFile(t, sw) != "100663296" {
			t.Fatalf("memory.memsw.limit_in_bytes %s", readFile(t, sw))
		}
	}
	if got, want := readFile(t, filepath.Join(c.PidsDir(), "pids.max")), strconv.FormatInt(BuildPidsMax(), 10); got != want {
		t.Fatalf("pids.max %s, want %s (a quarter of pid_max %d)", got, want, PidMax())
	}
	// A second start finds it, and may raise or lower the limit (memsw is kept at
	// or above memory in between).
	for _, limit := range []int64{200 << 20, 64 << 20} {
		c.Memory = limit
		if err := c.Setup(); err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{c.Dir(), c.PidsDir()} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after Remove, %s: %v", d, err)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestBuildCgroupV2Files checks what Setup writes on cgroup v2, on a directory laid out
// as the unified hierarchy (this machine's memory controller is on v1).
func TestBuildCgroupV2Files(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
	os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("cpu\n"), 0o644)
	c := BuildCgroup{Name: "bex-builds-test", Memory: 4 << 30, Pids: 8192, Root: root}
	// The kernel makes the interface files with the directory; here the test does.
	dir := filepath.Join(root, c.Name)
	os.MkdirAll(dir, 0o755)
	for _, f := range []string{"memory.max", "memory.swap.max", "pids.max", "cgroup.subtree_control"} {
		os.WriteFile(filepath.Join(dir, f), nil, 0o644)
	}
	if !c.Unified() || c.Dir() != dir {
		t.Fatalf("unified %v, dir %s", c.Unified(), c.Dir())
	}
	if err := c.Setup(); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		filepath.Join(root, "cgroup.subtree_control"): "+memory +pids",
		filepath.Join(dir, "memory.max"):              "4294967296",
		filepath.Join(dir, "memory.swap.max"):         "0",
		filepath.Join(dir, "pids.max"):                "8192",
		filepath.Join(dir, "cgroup.subtree_control"):  "+memory +pids",
	} {
		if got := readFile(t, file); got != want {
			t.Errorf("%s: %q, want %q", file, got, want)
		}
	}
}

func TestDefaultBuildMemory(t *testing.T) {
	total, err := memTotal()
	if err != nil {
		t.Fatal(err)
	}
	got := DefaultBuildMemory()
	if want := min(int64(4<<30), total/2); got != want {
		t.Fatalf("DefaultBuildMemory() = %d, want %d (MemTotal %d)", got, want, total)
	}
}
