package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestUpStopsCleanlyWhenItsOutputIsGone: bex up whose stdout and stderr are a
// pipe nobody reads any more (`bex up | tee log`, and tee was ended) still stops
// as a user would expect on SIGTERM: it exits cleanly, leaves no process and no
// mount under its state dir (the local runtime's pooled network namespaces,
// buildkitd's). Go's default for a write to a broken stdout is to die of
// SIGPIPE, which cut bex up's stop short and left those mounts behind.
func TestUpStopsCleanlyWhenItsOutputIsGone(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdio, p.out = w, &testenv.SyncBuffer{}
	// The reader: what bex up says, until it is up; then the pipe's last reader
	// goes away.
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.out.Write([]byte(sc.Text() + "\n"))
			if strings.Contains(sc.Text(), "bex is up.") {
				return
			}
		}
	}()
	p.start(t)
	if mounts := mountsUnder(t, p.dir); len(mounts) == 0 {
		t.Fatalf("bex up mounted nothing under %s: the check below would prove nothing", p.dir)
	}
	p.stop(t)
	testenv.Eventually(t, 10*time.Second, "no mount left under the state dir", func() error {
		if left := mountsUnder(t, p.dir); len(left) > 0 {
			return fmt.Errorf("left mounted: %s", strings.Join(left, ", "))
		}
		return nil
	})
}

// mountsUnder lists the mount points below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[1], dir+"/") {
			found = append(found, f[2]+" "+f[1])
		}
	}
	return found
}
