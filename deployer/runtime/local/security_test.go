package local

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// confinementProbe runs in the test image's busybox: it copies what the process sees of
// itself into /www, then serves /www on PORT, so the test reads each file with a GET.
// The cgroup files are v1's, else v2's.
const confinementProbe = `cp /proc/self/status /www/status
cp /proc/self/uid_map /www/uid_map
cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null > /www/memory || cat /sys/fs/cgroup/memory.max > /www/memory
cat /sys/fs/cgroup/pids/pids.max 2>/dev/null > /www/pids || cat /sys/fs/cgroup/pids.max > /www/pids
(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max) > /www/cpu
(touch /sys/bex-probe 2>&1 || true) > /www/sysfs
(ls /sys/class >/dev/null 2>&1 && echo readable || echo unreadable) >> /www/sysfs
exec httpd -f -p $PORT -h /www`

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
	f := newFixture(t, uniqueName("confined"))
	d := f.desired(1, f.v1, 1)
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", confinementProbe},
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

	// ps:resources changes the spec's resources: the instances are replaced, as
	// in a rollout, and the new one has the new limits (and the same uid range).
	old := eps[0]
	d.Processes["web"] = appv1.ProcessSpec{Replicas: 1, Command: []string{"sh", "-c", confinementProbe},
		Resources: &appv1.Resources{Memory: resource.NewQuantity(128<<20, resource.BinarySI)}}
	f.syncUntil(d, time.Minute, "rolled out with the new limits", func(st runtime.Status) bool {
		eps := f.endpoints()
		return st.RolledOut && len(eps) == 1 && eps[0] != old
	})
	eps = f.endpoints()
	if got := read("memory"); got != strconv.Itoa(128<<20) {
		t.Errorf("memory limit after the change: %q, want %d", got, 128<<20)
	}
	if got := read("cpu"); got != "-1" && got != "max" {
		t.Errorf("cpu quota after the cap was removed: %q", got)
	}
	if got := strings.Fields(read("uid_map")); len(got) != 3 || got[1] != strconv.FormatUint(uint64(base), 10) {
		t.Errorf("uid_map after the change: %v, want the same range %d", got, base)
	}
}

var nameSeq atomic.Int32

// uniqueName is name with a number, so that -count=N runs get fresh namespaces.
func uniqueName(name string) string { return fmt.Sprintf("%s-%d", name, nameSeq.Add(1)) }

// taskPid is the host pid of the one running instance of process.
func (f *fixture) taskPid(process string) uint32 {
	f.t.Helper()
	pid, err := f.runningPid(process)
	if err != nil {
		f.t.Fatal(err)
	}
	return pid
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
}

// eaterScript serves /www like the test app, with a CGI script /cgi-bin/eat. The
// first run waits for a GET of it and then doubles a shell string until the limit
// kills the shell (PID 1 of the container, so the kill ends the task; nothing else
// would end it); the restarted run serves only.
const eaterScript = `mkdir -p /www/cgi-bin
printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho eating\ntouch /eat\n' > /www/cgi-bin/eat
chmod +x /www/cgi-bin/eat
echo "version v1" > /www/index.html
if [ -e /eaten ]; then exec httpd -f -p $PORT -h /www; fi
httpd -p $PORT -h /www
while [ ! -e /eat ]; do sleep 0.05; done
touch /eaten
x=0123456789abcdef
while :; do x="$x$x"; done`

func TestInstanceOverItsMemoryLimitIsOOMKilledAndRestarted(t *testing.T) {
	f := newFixture(t, uniqueName("oom"))
	// A restart backoff long enough for the report of the kill to be seen.
	f.rt.Close()
	f.cfg.RestartBackoff = 2 * time.Second
	f.cfg.RestartBackoffMax = 2 * time.Second
	f.rt = f.newRuntime()
	d := f.desired(1, f.v1, 1)
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", eaterScript},
		Resources: &appv1.Resources{Memory: resource.NewQuantity(32<<20, resource.BinarySI)}}}
	f.syncUntil(d, time.Minute, "rolled out", rolledOut)
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	// The API server is asked throughout, from the kill until the instance is back.
	stop := make(chan struct{})
	apiDone := make(chan error, 1)
	var apiCalls atomic.Int32
	go func() {
		for {
			select {
			case <-stop:
				apiDone <- nil
				return
			case <-time.After(20 * time.Millisecond): // no wait: the pace of the API calls under way
			}
			if _, err := readEndpoints(f.k8s, f.key()); err != nil {
				apiDone <- err
				return
			}
			apiCalls.Add(1)
		}
	}()
	if got, err := get(eps[0] + "/cgi-bin/eat"); err != nil || got != "eating" {
		t.Fatalf("GET /cgi-bin/eat = %q, %v", got, err)
	}

	st := f.syncUntil(d, 30*time.Second, "OOMKilled reported", func(st runtime.Status) bool { return st.Failure != "" })
	if st.Failure != appv1.OOMKilledReason || !strings.Contains(st.Message, "web.1 ran out of memory (limit 32 MiB)") || st.Serving != 1 {
		t.Fatalf("status after the kill: %+v", st)
	}
	st = f.syncUntil(d, time.Minute, "rolled out again", rolledOut)
	close(stop)
	if err := <-apiDone; err != nil || apiCalls.Load() == 0 {
		t.Fatalf("the API server during the kill and the restart: %v (%d answers)", err, apiCalls.Load())
	}
	if p := st.Processes["web"]; p.OOMKills != 1 || p.Restarts != 1 || p.Ready != 1 {
		t.Fatalf("web after the restart: %+v", p)
	}
	eps = f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints after the restart: %v", eps)
	}
	f.mustGet(eps[0], "version v1")
	f.rt.mu.Lock()
	var last string
	for _, inst := range f.rt.apps[f.key()].instances {
		last = inst.lastExit
	}
	f.rt.mu.Unlock()
	if !strings.Contains(last, "ran out of memory (limit 32 MiB) and was killed (OOMKilled)") {
		t.Fatalf("last exit: %q", last)
	}
}

func TestOOMCounterFiles(t *testing.T) {
	dir := t.TempDir()
	v1 := dir + "/memory.oom_control"
	v2 := dir + "/memory.events"
	if err := os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := counter(v1, "oom_kill"); n != 2 {
		t.Errorf("v1 oom_kill: %d", n)
	}
	if n := counter(v2, "oom_kill"); n != 1 {
		t.Errorf("v2 oom_kill: %d", n)
	}
	if n := counter(dir+"/missing", "oom_kill"); n != -1 {
		t.Errorf("missing file: %d", n)
	}
	if n := oomKills("slice:prefix:name"); n != -1 {
		t.Errorf("systemd path: %d", n)
	}
}
