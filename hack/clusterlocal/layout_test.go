package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Two DIRs get different names and links, each within the kernel's limits, and the
// same DIR always the same (down finds what up made).
func TestLayoutNamesFollowDir(t *testing.T) {
	a, err := newLayout("/tmp/bex-cluster-a")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := newLayout("/tmp/bex-cluster-a/")
	b, _ := newLayout("/tmp/bex-cluster-b")
	if a.netns() != again.netns() || a.nodeIP != again.nodeIP {
		t.Errorf("the same DIR gave %s %s and %s %s", a.netns(), a.nodeIP, again.netns(), again.nodeIP)
	}
	if a.netns() == b.netns() || a.hostVeth() == b.hostVeth() || a.nodeIP == b.nodeIP {
		t.Errorf("two DIRs share names or addresses: %s %s %s, %s %s %s", a.netns(), a.hostVeth(), a.nodeIP, b.netns(), b.hostVeth(), b.nodeIP)
	}
	for _, l := range []*layout{a, b} {
		if n := len(l.hostVeth()); n > 15 {
			t.Errorf("veth name %q is %d bytes, over IFNAMSIZ-1", l.hostVeth(), n)
		}
		// Both ends in one /30 of 10.213.0.0/16, neither its network nor its broadcast.
		h, n := l.hostIP.As4(), l.nodeIP.As4()
		if h[0] != 10 || h[1] != 213 || h[3]%4 != 1 || n[3] != h[3]+1 || h[2] != n[2] {
			t.Errorf("link %s - %s is not the middle of one /30 of 10.213.0.0/16", l.hostIP, l.nodeIP)
		}
	}
	if _, err := newLayout("relative/dir"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("a relative DIR: %v", err)
	}
}

// The node's containerd runs pods with bin/runc (the CRI's runc BinaryName), as
// Debian's containerd 1.6 reads it: `containerd config dump` of the written file.
func TestNodeContainerdUsesBinRunc(t *testing.T) {
	l, err := newLayout(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const runc = "/src/bex/bin/runc"
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(l.containerdConfig(runc)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("containerd", "--config", path, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `BinaryName = "`+runc+`"`) {
		t.Fatalf("the runc runtime's options lack BinaryName %s:\n%s", runc, out)
	}
}
