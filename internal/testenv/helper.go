package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Helper is the test binary itself, run again as a server of its own: how a
// benchmark measures a server of the project in a process apart from the load
// generator, as it does nginx. The package's TestMain recognises the helper by
// an environment variable it chooses, and serves instead of running tests.
type Helper struct {
	server
}

// StartHelper runs the test binary in dir with env added to its environment,
// its output in dir/name.log, and waits until every address in listen accepts
// connections.
func StartHelper(dir, name string, env []string, listen ...string) (*Helper, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	srv, err := startServer(dir, name, self, []string{"-test.run=^$"}, env, 5*time.Second, 30*time.Second, listen)
	if err != nil {
		return nil, err
	}
	return &Helper{srv}, nil
}

// PeakRSS is the most resident memory the helper has had (VmHWM), in bytes; 0
// if it has exited.
func (h *Helper) PeakRSS() int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.proc.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
