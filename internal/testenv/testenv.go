package testenv

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"bex.co/bex/internal/freeport"
)

// shared holds the daemons started for this test binary. They live until Run returns.
var shared struct {
	mu      sync.Mutex
	inRun   bool
	dir     string
	started map[string]any   // name -> the daemon's handle
	failed  map[string]error // name -> why it could not start; asked again, it fails again
	stops   []func() error   // in start order; run in reverse
}

// Run runs the tests of m, then stops every daemon they started. Call it from
// TestMain so that no daemon outlives the test binary.
func Run(m *testing.M) int {
	shared.mu.Lock()
	shared.inRun = true
	shared.mu.Unlock()
	// containerd's shims daemonise; as a subreaper this process inherits them
	// rather than an init that may never reap them, and reaps them at the end.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// envtest and any controller under test log through controller-runtime: show
	// their warnings and errors, not their chatter.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	code := m.Run()
	err := stopShared()
	reapOrphans()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping daemons: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// reapOrphans collects the exit status of inherited processes that have ended.
func reapOrphans() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	var errs []error
	for i := len(shared.stops) - 1; i >= 0; i-- {
		errs = append(errs, shared.stops[i]())
	}
	shared.stops = nil
	shared.started = nil
	if shared.dir != "" {
		errs = append(errs, removeAll(shared.dir))
		shared.dir = ""
	}
	return errors.Join(errs...)
}

// Shared returns the daemon called name, starting it with start on first use in
// this test binary; Run stops it at the end. start gets a fresh directory of its
// own and returns the handle and its stop func. A package may share its own
// daemons through it (cmd/bex/e2e shares one bex up).
func Shared[T any](t testing.TB, name string, start func(dir string) (T, func() error, error)) T {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	var zero T
	if !shared.inRun {
		t.Fatalf("testenv: %s is shared by the whole test binary: add `func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }` to the package's tests", name)
		return zero
	}
	if d, ok := shared.started[name]; ok {
		return d.(T)
	}
	if err, ok := shared.failed[name]; ok {
		t.Fatalf("testenv: %s failed to start earlier in this run: %v", name, err)
		return zero
	}
	if shared.dir == "" {
		// 0700: containerd's bundles, which the containers' user namespaces must
		// reach, are in /run/bex (daemons.Containerd.State).
		dir, err := os.MkdirTemp("", "bex-testenv-")
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		shared.dir = dir
	}
	dir := filepath.Join(shared.dir, name)
	d, stop, err := start(dir)
	if err != nil {
		if shared.failed == nil {
			shared.failed = map[string]error{}
		}
		shared.failed[name] = err
		t.Fatalf("testenv: start %s: %v", name, err)
		return zero
	}
	if shared.started == nil {
		shared.started = map[string]any{}
	}
	shared.started[name] = d
	shared.stops = append(shared.stops, stop)
	return d
}

// RepoRoot is the directory of bex's go.mod, found from the working directory
// (go test runs each package in its own directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module bex.co/bex\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the bex repository (no go.mod of module bex.co/bex above the working directory)")
		}
		dir = parent
	}
}

// Binary finds a daemon or tool: first in bin/ of the repository (built by `make
// tools`), then on PATH (Debian's packages). The error says how to install it.
func Binary(name string) (string, error) {
	if root, err := RepoRoot(); err == nil {
		p := filepath.Join(root, "bin", name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s is not installed: run `make tools` (hack/tools.sh builds it into bin/ or installs its Debian package)", name)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for a
// daemon that is told its port before it listens (freeport.Loopback: outside the
// ephemeral range, which other tests' outgoing connections draw from).
func FreePort() (int, error) { return freeport.Loopback() }
