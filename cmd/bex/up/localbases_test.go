package up

import (
	"slices"
	"testing"

	"bex.co/bex/internal/machine/baseimage"
)

// Without --local-bases the gitserver gets no --plan-image-* flag (the plans keep
// the official images); with it, every plan base names a stand-in, or busybox for
// static sites.
func TestPlanImageArgs(t *testing.T) {
	if args := (&Platform{cfg: Config{}}).planImageArgs(); args != nil {
		t.Errorf("without --local-bases: %q, want none", args)
	}
	args := (&Platform{cfg: Config{LocalBases: true}}).planImageArgs()
	n := baseimage.DefaultNames()
	for _, pair := range [][2]string{
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
