package daemons

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// BuildCgroup is the cgroup buildkitd puts every build step under (its workers'
// defaultCgroupParent): runc makes each step's cgroup at NAME/buildkit/<id> below
// it, so Memory bounds all the steps running at once, of every build, together.
// It is made at the top of the cgroup hierarchy, beside and not inside the cgroup
// bex and buildkitd run in: the kernel's OOM killer, when the limit is hit, chooses
// its victim among the steps only, and buildkitd, containerd and the platform live
// on. Swap is included in the limit where the kernel accounts it, so that a step
// cannot go on past it in swap. Pids bounds the tasks of all the steps together in
// the same way (pids.go): a fork bomb in a step fails there, not in the platform.
type BuildCgroup struct {
	// Name is its path below the hierarchy's root, e.g. bex-builds-1a2b3c4d.
	Name string
	// Memory is the limit, in bytes.
	Memory int64
	// Pids is the most tasks (processes and threads) of all the steps together;
	// 0 is BuildPidsMax().
	Pids int64
	// Root is where the cgroup file systems are mounted; empty is /sys/fs/cgroup.
	Root string
}

// BuildCgroupFor is the build cgroup of the buildkitd whose state is in dir: its name
// is made from dir, so that two buildkitds on one machine (bex up and a test) never
// share one, and the same buildkitd finds its own again after a restart.
func BuildCgroupFor(dir string, memory int64) BuildCgroup {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	sum := sha256.Sum256([]byte(abs))
	return BuildCgroup{Name: "bex-builds-" + hex.EncodeToString(sum[:4]), Memory: memory}
}

func (c BuildCgroup) pids() int64 {
	if c.Pids > 0 {
		return c.Pids
	}
	return BuildPidsMax()
}

// PidsDir is the directory of the cgroup in the pids controller's hierarchy, where
// its pids.max is: Dir on cgroup v2.
func (c BuildCgroup) PidsDir() string {
	if c.Unified() {
		return c.Dir()
	}
	return filepath.Join(c.root(), "pids", c.Name)
}

func (c BuildCgroup) root() string {
	if c.Root == "" {
		return "/sys/fs/cgroup"
	}
	return c.Root
}

// Unified reports whether the memory controller is on cgroup v2: /sys/fs/cgroup is
// the unified hierarchy. A hybrid machine (v1 controllers, an empty v2 hierarchy at
// /sys/fs/cgroup/unified) is v1 for memory, as runc sees it.
func (c BuildCgroup) Unified() bool {
	_, err := os.Stat(filepath.Join(c.root(), "cgroup.controllers"))
	return err == nil
}

// Dir is the directory of the cgroup in the memory controller's hierarchy, where
// its limit and OOM counters are.
func (c BuildCgroup) Dir() string {
	if c.Unified() {
		return filepath.Join(c.root(), c.Name)
	}
	return filepath.Join(c.root(), "memory", c.Name)
}

// Setup makes the cgroup (or finds it from a previous start) and sets its limit.
func (c BuildCgroup) Setup() error {
	if c.Name == "" || strings.Contains(c.Name, "..") || c.Memory <= 0 {
		return fmt.Errorf("build cgroup %q with limit %d: want a name and a positive limit", c.Name, c.Memory)
	}
	if c.Unified() {
		return c.setupV2()
	}
	return c.setupV1()
}

func (c BuildCgroup) setupV1() error {
	if _, err := os.Stat(filepath.Join(c.root(), "memory", "memory.limit_in_bytes")); err != nil {
		return fmt.Errorf("no cgroup v1 memory controller at %s/memory, and no cgroup v2 at %s: build steps cannot be limited (%w)", c.root(), c.root(), err)
	}
	dir := c.Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the build steps' cgroup: %w", err)
	}
	limit := strconv.FormatInt(c.Memory, 10)
	memsw := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	_, swErr := os.Stat(memsw)
	hasSwap := swErr == nil
	// memory+swap may never be below memory: lift it first, set memory, then
	// bring memory+swap down to the same value (no swap for build steps).
	if hasSwap {
		if err := writeCgroup(memsw, "-1"); err != nil {
			return err
		}
	}
	if err := writeCgroup(filepath.Join(dir, "memory.limit_in_bytes"), limit); err != nil {
		return err
	}
	if hasSwap {
		if err := writeCgroup(memsw, limit); err != nil {
			return err
		}
	}
	// runc makes each step's cgroup in every v1 hierarchy; the pids one is where
	// the steps' tasks are counted together.
	if _, err := os.Stat(filepath.Join(c.root(), "pids")); err != nil {
		return fmt.Errorf("no cgroup v1 pids controller at %s/pids: build steps' tasks cannot be limited (%w)", c.root(), err)
	}
	pdir := c.PidsDir()
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return fmt.Errorf("making the build steps' pids cgroup: %w", err)
	}
	return writeCgroup(filepath.Join(pdir, "pids.max"), strconv.FormatInt(c.pids(), 10))
}

func (c BuildCgroup) setupV2() error {
	// The root's subtree_control must hand the memory and pids controllers down;
	// writing "+memory +pids" to the root is allowed whatever processes it holds.
	ctl := filepath.Join(c.root(), "cgroup.subtree_control")
	if enable := missingControllers(ctl); enable != "" {
		if err := writeCgroup(ctl, enable); err != nil {
			return fmt.Errorf("enabling the memory and pids controllers for build steps: %w", err)
		}
	}
	dir := c.Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the build steps' cgroup: %w", err)
	}
	if err := writeCgroup(filepath.Join(dir, "memory.max"), strconv.FormatInt(c.Memory, 10)); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
		if err := writeCgroup(filepath.Join(dir, "memory.swap.max"), "0"); err != nil {
			return err
		}
	}
	if err := writeCgroup(filepath.Join(dir, "pids.max"), strconv.FormatInt(c.pids(), 10)); err != nil {
		return err
	}
	// runc makes NAME/buildkit and enables the controllers down to each step's
	// cgroup; NAME's own subtree_control must list memory and pids for that.
	if sub := filepath.Join(dir, "cgroup.subtree_control"); missingControllers(sub) != "" {
		if err := writeCgroup(sub, missingControllers(sub)); err != nil {
			return fmt.Errorf("enabling the memory and pids controllers below %s: %w", dir, err)
		}
	}
	return nil
}

// missingControllers is what to write to a cgroup.subtree_control file that lacks
// memory or pids ("+memory +pids", "+pids", ...); empty when it has both.
func missingControllers(file string) string {
	var add []string
	for _, name := range []string{"memory", "pids"} {
		if !hasController(file, name) {
			add = append(add, "+"+name)
		}
	}
	return strings.Join(add, " ")
}

// Remove removes the cgroup and the buildkit/ directory runc made in it, in every
// hierarchy (runc makes the path in each v1 controller's). Steps still running keep
// it (EBUSY), which is not an error: the next start finds it.
func (c BuildCgroup) Remove() error {
	var dirs []string
	if c.Unified() {
		dirs = []string{c.Dir()}
	} else {
		entries, err := os.ReadDir(c.root())
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(c.root(), e.Name(), c.Name))
			}
		}
	}
	var errs []error
	for _, d := range dirs {
		for _, p := range []string{filepath.Join(d, "buildkit"), d} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.EBUSY) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func writeCgroup(file, value string) error {
	if err := os.WriteFile(file, []byte(value), 0); err != nil {
		return fmt.Errorf("writing %s to %s: %w", value, file, err)
	}
	return nil
}

func hasController(file, name string) bool {
	data, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	for _, f := range strings.Fields(string(data)) {
		if f == name {
			return true
		}
	}
	return false
}

// DefaultBuildMemory is the build steps' default limit: the smaller of 4 GiB and half
// the machine's memory, so that a build leaves the apps and the platform at least
// half of it.
func DefaultBuildMemory() int64 {
	const max = 4 << 30
	total, err := memTotal()
	if err != nil || total/2 >= max {
		return max
	}
	return total / 2
}

func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}

// withCgroupParent puts defaultCgroupParent into the section of the worker that is
// enabled in a buildkitd.toml made by WriteConfig (the containerd worker's when it
// has a containerd, else the OCI worker's).
func withCgroupParent(config string, containerd bool, parent string) string {
	if parent == "" {
		return config
	}
	header := "[worker.oci]\n"
	if containerd {
		header = "[worker.containerd]\n"
	}
	return strings.Replace(config, header, header+fmt.Sprintf("  defaultCgroupParent = %q\n", parent), 1)
}
