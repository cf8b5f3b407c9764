package local

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// probeScript runs in the test image's busybox: it copies what the process sees of
// itself into /www, then serves /www on PORT, so the test reads each file with a GET.
// The cgroup files are v1's, else v2's.
const probeScript = `cp /proc/self/status /www/status
cp /proc/self/uid_map /www/uid_map
cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null > /www/memory || cat /sys/fs/cgroup/memory.max > /www/memory
cat /sys/fs/cgroup/pids/pids.max 2>/dev/null > /www/pids || cat /sys/fs/cgroup/pids.max > /www/pids
(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max) > /www/cpu
(touch /sys/bex-probe 2>&1 || true) > /www/sysfs
(ls /sys/class >/dev/null 2>&1 && echo readable || echo unreadable) >> /www/sysfs
exec httpd -f -p 127.0.0.1:$PORT -h /www`

// capBit is the bit of a capability in /proc/PID/status's Cap* masks.
var capBit = map[string]uint{"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_KILL": 5, "CAP_SETUID": 7,
	"CAP_NET_BIND_SERVICE": 10, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_MKNOD": 27}

func statusField(status, name string) string {
	m := regexp.MustCompile(`(?m)^` + name + `:\s*(.*)$`).FindStringSubmatch(status)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(m[1])
}

func TestInstanceIsConfined(t *testing.T) {
	f := newFixture(t, "confined")
	d := f.desired(1, f.v1, 1)
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", probeScript},
		Resources: &appv1.Resources{Memory: resource.NewQuantity(96<<20, resource.BinarySI), CPU: resource.NewMilliQuantity(1500, resource.DecimalSI)}}}
	f.syncUntil(d, time.Minute, "rolled out", rolledOut)
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	read := func(name string) string {
		t.Helper()
		s, err := get(eps[0] + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Inside: the capability set, no new privileges, the seccomp filter.
	status := read("status")
	eff, err := strconv.ParseUint(statusField(status, "CapEff"), 16, 64)
	if err != nil {
		t.Fatalf("CapEff in %q: %v", status, err)
	}
	for _, c := range []string{"CAP_NET_RAW", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_MKNOD"} {
		if eff&(1<<capBit[c]) != 0 {
			t.Errorf("%s is in CapEff %x", c, eff)
		}
	}
	for _, c := range []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETUID", "CAP_NET_BIND_SERVICE"} {
		if eff&(1<<capBit[c]) == 0 {
			t.Errorf("%s is not in CapEff %x", c, eff)
		}
	}
	if bnd := statusField(status, "CapBnd"); bnd != statusField(status, "CapEff") {
		t.Errorf("CapBnd %s differs from CapEff %s", bnd, statusField(status, "CapEff"))
	}
	if v := statusField(status, "NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs: %q", v)
	}
	if v := statusField(status, "Seccomp"); v != "2" {
		t.Errorf("Seccomp: %q (2 is a filter)", v)
	}
	if v := statusField(status, "Uid"); !strings.HasPrefix(v, "0\t") {
		t.Errorf("Uid inside: %q, want 0", v)
	}

	// Inside: uid 0 is the app's range on the host.
	f.rt.store.mu.Lock()
	base := f.rt.store.st.IDs[f.key().String()]
	f.rt.store.mu.Unlock()
	if base < f.rt.cfg.IDBase {
		t.Fatalf("the app's uid range starts at %d, below the base %d", base, f.rt.cfg.IDBase)
	}
	if got, want := strings.Fields(read("uid_map")), []string{"0", strconv.FormatUint(uint64(base), 10), "65536"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("uid_map %v, want %v", got, want)
	}

	// Inside: the cgroup's limits.
	if got := read("memory"); got != strconv.Itoa(96<<20) {
		t.Errorf("memory limit inside: %q, want %d", got, 96<<20)
	}
	if got := read("pids"); got != strconv.Itoa(appv1.DefaultPids) {
		t.Errorf("pids limit inside: %q, want %d", got, appv1.DefaultPids)
	}
	if got := read("cpu"); got != "150000" {
		t.Errorf("cpu quota inside: %q, want 150000 (1.5 CPUs of a 100 ms period)", got)
	}
	// /sys is the host's, read-only: readable, not writable.
	if got := read("sysfs"); !strings.Contains(got, "Read-only file system") || !strings.HasSuffix(got, "readable") {
		t.Errorf("/sys inside: %q", got)
	}

	// From the host: the process runs as the app's uid.
	pid := f.taskPid("web")
	hostStatus, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	uids := strings.Fields(statusField(string(hostStatus), "Uid"))
	for _, u := range uids {
		if u != strconv.FormatUint(uint64(base), 10) {
			t.Errorf("host view of the instance's uids: %v, want all %d", uids, base)
			break
		}
	}
	if gids := strings.Fields(statusField(string(hostStatus), "Gid")); len(gids) == 0 || gids[0] != strconv.FormatUint(uint64(base), 10) {
		t.Errorf("host view of the instance's gids: %v, want %d", gids, base)
	}
}

// taskPid is the host pid of the one running instance of process.
func (f *fixture) taskPid(process string) uint32 {
	f.t.Helper()
	f.rt.mu.Lock()
	var inst *instance
	for _, i := range f.rt.apps[f.key()].instances {
		if i.process == process && i.running && !i.leaving() {
			inst = i
		}
	}
	f.rt.mu.Unlock()
	if inst == nil {
		f.t.Fatalf("no running %s instance", process)
	}
	task, err := inst.ctr.Task(f.rt.ctx, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return task.Pid()
}

func TestDefaultLimits(t *testing.T) {
	l := limitsOf(appv1.ProcessSpec{})
	if l.memory != 512<<20 || l.pids != 4096 || l.cpuMillis != 0 || l.cpuShares() != 1024 {
		t.Fatalf("defaults: %+v, shares %d", l, l.cpuShares())
	}
	two := resource.MustParse("2")
	l = limitsOf(appv1.ProcessSpec{Resources: &appv1.Resources{CPU: &two}})
	if l.cpuMillis != 2000 || l.cpuShares() != 2048 {
		t.Fatalf("2 CPUs: %+v, shares %d", l, l.cpuShares())
	}
	tiny := resource.MustParse("10m")
	if s := limitsOf(appv1.ProcessSpec{Resources: &appv1.Resources{CPU: &tiny}}).cpuShares(); s != 10 {
		t.Fatalf("shares of 10m: %d, want the minimum 10", s)
	}
	_ = runtime.Capabilities
	_ = context.Background
}
