package builder

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// oomWatch counts the OOM kills under the build steps' cgroup (Config.StepCgroup).
// A step's exit code alone cannot tell a step the kernel killed for the limit from
// one that died of SIGKILL for another reason (137 either way); the cgroup's own
// counters can.
//
// On cgroup v2, memory.events of the parent counts the kills of its whole subtree
// (oom_kill), so it is read when needed. On cgroup v1 the oom_kill of
// memory.oom_control counts only kills of the victim's own cgroup, and each step has
// a cgroup of its own that is gone once the step ends; the parent's OOM
// notification (an eventfd registered through cgroup.event_control on
// memory.oom_control) fires when the parent's limit is hit, so the watch counts
// those.
type oomWatch struct {
	dir   string
	v2    bool
	count atomic.Int64 // v1: notifications seen
	efd   *os.File     // v1
	ctl   *os.File     // v1: memory.oom_control, held while registered
}

func watchOOM(dir string) (*oomWatch, error) {
	w := &oomWatch{dir: dir}
	if _, err := os.Stat(filepath.Join(dir, "memory.events")); err == nil {
		w.v2 = true
		if _, err := w.kills(); err != nil {
			return nil, err
		}
		return w, nil
	}
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return nil, fmt.Errorf("the build steps' cgroup %s has neither memory.events nor memory.oom_control: %w", dir, err)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ctl.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	efd := os.NewFile(uintptr(fd), "oom-eventfd")
	reg := fmt.Sprintf("%d %d", fd, ctl.Fd())
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(reg), 0); err != nil {
		efd.Close()
		ctl.Close()
		return nil, fmt.Errorf("registering for the OOM notifications of %s: %w", dir, err)
	}
	w.efd, w.ctl = efd, ctl
	go w.readV1()
	return w, nil
}

// readV1 counts notifications until the eventfd is closed. The kernel signals the
// eventfd also when the cgroup is removed, which is no OOM: then it stops.
func (w *oomWatch) readV1() {
	buf := make([]byte, 8)
	for {
		if _, err := w.efd.Read(buf); err != nil {
			return
		}
		if _, err := os.Stat(filepath.Join(w.dir, "memory.oom_control")); err != nil {
			return
		}
		w.count.Add(int64(binary.LittleEndian.Uint64(buf)))
	}
}

// kills returns the number of OOM kills (v2) or OOM notifications (v1) so far.
func (w *oomWatch) kills() (int64, error) {
	if !w.v2 {
		return w.count.Load(), nil
	}
	f, err := os.Open(filepath.Join(w.dir, "memory.events"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("memory.events has no oom_kill line")
}

// killedSince reports whether a kill was counted after before. A killed step's
// failure may reach the client before the v1 notification reaches the watch's
// goroutine, so a step that died of SIGKILL waits for the count a little.
func (w *oomWatch) killedSince(before int64, sigkill bool) bool {
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := w.kills()
		if err == nil && n > before {
			return true
		}
		if !sigkill || time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling a counter, with a deadline
	}
}

func (w *oomWatch) Close() error {
	if w == nil || w.v2 {
		return nil
	}
	w.ctl.Close()
	return w.efd.Close()
}
