package up

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"bex.co/bex/internal/machine/baseimage"
)

// Without --local-bases the gitserver gets no --plan-image-* flag (the plans keep
// the official images); with it, every plan base names a stand-in, or busybox for
// static sites, and the builds wait for the file that says they are ready.
func TestPlanImageArgs(t *testing.T) {
	if args := (&Platform{cfg: Config{}}).planImageArgs(); args != nil {
		t.Errorf("without --local-bases: %q, want none", args)
	}
	p := &Platform{cfg: Config{LocalBases: true, StateDir: "/var/lib/bex"}}
	args := p.planImageArgs()
	n := baseimage.DefaultNames()
	for _, pair := range [][2]string{
		// The stand-ins are made after bex is up: the plans' builds wait for this file.
		{"--plan-bases-ready", "/var/lib/bex/run/local-bases.ready"},
		{"--plan-image-go", n.Go}, {"--plan-image-node", n.Node}, {"--plan-image-python", n.Python},
		{"--plan-image-runtime", n.Runtime}, {"--plan-image-stack", n.Stack}, {"--plan-image-static", baseimage.BusyboxRef},
		{"--plan-image-ruby", n.Ruby}, {"--plan-image-php", n.PHP}, {"--plan-image-composer", n.PHP},
	} {
		i := slices.Index(args, pair[0])
		if i < 0 || i+1 >= len(args) || args[i+1] != pair[1] {
			t.Errorf("%s %s missing from %q", pair[0], pair[1], args)
		}
	}
}

// The file that tells the gitserver the stand-ins are ready is empty, and the one
// that says they could not be made holds the reason on one line; neither is ever
// seen half written (a rename).
func TestWriteBasesReady(t *testing.T) {
	dir := t.TempDir()
	ok, failed := filepath.Join(dir, "ok"), filepath.Join(dir, "failed")
	if err := writeBasesReady(ok, nil); err != nil {
		t.Fatal(err)
	}
	if err := writeBasesReady(failed, errors.New("mmdebstrap failed:\nno space left on device")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(ok); err != nil || len(b) != 0 {
		t.Errorf("ready: %q, %v; want an empty file", b, err)
	}
	if b, err := os.ReadFile(failed); err != nil || string(b) != "mmdebstrap failed: no space left on device\n" {
		t.Errorf("failed: %q, %v; want the reason on one line", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
