package testapps

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ProbeResult is one attempt of the probe app (infra/cluster/testdata/probe), as
// it answers in JSON.
type ProbeResult struct {
	Target    string `json:"target"`
	Connected bool   `json:"connected"`
	Status    int    `json:"status"`
	Body      string `json:"body"`
	Err       string `json:"err"`
}

// ProbeDockerfile runs the probe as the app, on busybox.
const ProbeDockerfile = "FROM busybox\nCOPY --chmod=755 probe /probe\nCMD [\"/probe\"]\n"

// BuildProbe builds the probe program (static, stripped) as dir/probe, from the
// repository at root.
func BuildProbe(root, dir string) error {
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "probe"), "./infra/cluster/testdata/probe")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build the probe: %v\n%s", err, out)
	}
	return nil
}
