package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runUp runs bex up expecting it to refuse at once, and returns its output.
func runUp(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("bex up started:\n%s", out)
	}
	if n := strings.Count(strings.TrimSpace(string(out)), "\n"); n != 0 {
		t.Errorf("want one line, got %d:\n%s", n+1, out)
	}
	return string(out)
}

func TestUpRefusesToRunAsAnotherUserThanRoot(t *testing.T) {
	dir := t.TempDir()
	// The binary must be reachable by the unprivileged user.
	bin := filepath.Join(dir, "bex")
	if out, err := exec.Command("cp", bexBinary, bin).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := runUp(t, exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", bin, "up", "--state-dir", filepath.Join(dir, "state")))
	if !strings.Contains(out, "bex up must run as root") || !strings.Contains(out, "sudo") {
		t.Fatalf("output: %s", out)
	}
}

func TestUpSaysWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bex")
	if out, err := exec.Command("cp", bexBinary, bin).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	cmd := exec.Command(bin, "up", "--state-dir", filepath.Join(dir, "state"))
	cmd.Env = []string{"PATH=" + filepath.Join(dir, "empty")}
	out := runUp(t, cmd)
	for _, want := range []string{"containerd", "runc", "buildkitd", "etcd", "kube-apiserver", "git", "make tools", "apt-get install"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q: %s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
		t.Error("bex up made its state dir before it found what is missing")
	}
}

// bex up refuses Debian 12's runc (1.1.5, without the November 2025 fixes) in one
// line that says how to get a newer, before it makes anything.
func TestUpRefusesAnOldRunc(t *testing.T) {
	dir := t.TempDir()
	p := &platform{dir: filepath.Join(dir, "state")}
	cmd := p.upCommand("--state-dir", p.dir, "--runc", "/usr/sbin/runc")
	out := runUp(t, cmd)
	for _, want := range []string{"runc 1.1.5", "/usr/sbin/runc", "CVE-2025-31133", "make tools", "--runc"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q: %s", want, out)
		}
	}
	if _, err := os.Stat(p.dir); err == nil {
		t.Error("bex up made its state dir before it refused the runc")
	}
}
