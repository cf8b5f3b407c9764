package local

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/daemons"
	"k8s.io/apimachinery/pkg/types"
)

// The cases are the kubelet's (third_party/forked/golang/expansion tests).
func TestExpandFollowsKubeletRules(t *testing.T) {
	vars := map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_EMPTY": "", "PORT": "20001"}
	for _, tc := range []struct{ in, want string }{
		{"$(VAR_A)", "A"},
		{"___$(VAR_B)___", "___B___"},
		{"$(VAR_A)-$(VAR_B)-$(VAR_C)", "A-B-C"},
		{"foo$(VAR_EMPTY)bar", "foobar"},
		{"$(VAR_DOES_NOT_EXIST)", "$(VAR_DOES_NOT_EXIST)"},
		{"$$(VAR_A)", "$(VAR_A)"},
		{"$$$(VAR_A)", "$A"},
		{"$$$$(VAR_A)", "$$(VAR_A)"},
		{"$$", "$"},
		{"$", "$"},
		{"foo$", "foo$"},
		{"$(VAR_A", "$(VAR_A"},
		{"$VAR_A", "$VAR_A"},
		{"${VAR_A}", "${VAR_A}"},
		{"$()", "$()"},
		{"httpd -p $(PORT) && echo $$HOME", "httpd -p 20001 && echo $HOME"},
		{"\n$(VAR_A)\t", "\nA\t"},
	} {
		if got := expand(tc.in, vars); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	cfg := Config{StateDir: t.TempDir()}.withDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if cfg.Namespace != "bex" || cfg.PortMin != 20000 || cfg.PortMax != 29999 || cfg.Drain.Seconds() != 5 ||
		cfg.BootTimeout.Seconds() != 60 || cfg.RestartBackoff.Seconds() != 1 || cfg.RestartBackoffMax.Seconds() != 30 ||
		cfg.CrashLoopRestarts != 3 || cfg.CrashLoopWindow.Minutes() != 1 {
		t.Errorf("unexpected defaults: %+v", cfg)
	}
	if cfg.CgroupParent != "bex" || cfg.TenantsPidsMax != daemons.TenantsPidsMax() || cfg.TenantsPidsMax < 1024 {
		t.Errorf("the tenants' cgroup: %q with pids.max %d, want bex (containerd's own path) and half of pid_max", cfg.CgroupParent, cfg.TenantsPidsMax)
	}
	bad := Config{PortMin: 30000, PortMax: 20000, RestartBackoff: 10, RestartBackoffMax: 5, LogMaxBytes: 10, CgroupParent: "../x", TenantsPidsMax: 10}
	err := bad.Validate()
	for _, want := range []string{"Config.StateDir: required", "port range 30000-20000", "Config.RestartBackoffMax", "log size limit 10", `Config.CgroupParent "../x"`, "Config.TenantsPidsMax 10"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestContainerIDIsValidForContainerd(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, key := range []types.NamespacedName{
		{Namespace: "default", Name: "myapp"},
		{Namespace: "a--b", Name: "x--y"},
		{Namespace: long, Name: strings.Repeat("b", 40)},
	} {
		id := containerID(key, "web", 12, 3)
		if len(id) > 76 || strings.Contains(id, "--") || strings.HasPrefix(id, "-") {
			t.Errorf("containerID(%v) = %q: not a containerd identifier", key, id)
		}
		if !strings.Contains(id, "-web-r12-3-") {
			t.Errorf("containerID(%v) = %q: lost the process, release or index", key, id)
		}
	}
	if a, b := containerID(types.NamespacedName{Namespace: "n", Name: "a"}, "web", 1, 1), containerID(types.NamespacedName{Namespace: "n", Name: "a"}, "web", 1, 1); a == b {
		t.Errorf("two ids of the same slot are equal: %q", a)
	}
}

func TestPortsArePersistedNeverSharedAndBindChecked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	// Hold a port of the range: the allocator must skip it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	s, err := openStore(path, held, held+2, 1<<30, 4)
	if err != nil {
		t.Fatal(err)
	}
	// The real bind check for the held port; the other two are taken as free, since
	// any process on the machine may hold them for a moment (they are near the
	// ephemeral range).
	s.bindable = func(p int) bool { return p != held || portBindable(p) }
	p1, err := s.allocate("c1")
	if err != nil {
		t.Fatal(err)
	}
	if p1 == held {
		t.Fatalf("allocated port %d that another process listens on", held)
	}
	p2, err := s.allocate("c2")
	if err != nil {
		t.Fatal(err)
	}
	if p1 == p2 {
		t.Fatalf("two instances got port %d", p1)
	}
	if _, err := s.allocate("c3"); err == nil || !strings.Contains(err.Error(), "no free port in "+strconv.Itoa(held)) {
		t.Fatalf("allocation from an exhausted range: %v", err)
	}
	// Another store on the same file (a restart) sees the reservations.
	s2, err := openStore(path, held, held+2, 1<<30, 4)
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := s2.owner(p1); id != "c1" {
		t.Fatalf("after reopen, port %d is held by %q, want c1", p1, id)
	}
	// Freeing needs the owner; retain frees what no live container holds.
	if err := s2.free(p1, "someone-else"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.owner(p1); !ok {
		t.Fatal("a port was freed by a container that does not hold it")
	}
	if err := s2.retain(map[string]bool{"c2": true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.owner(p1); ok || s2.reserved() != 1 {
		t.Fatalf("retain kept the port of a gone container: reserved %d", s2.reserved())
	}
}

func TestLogPrefix(t *testing.T) {
	if got := logPrefix("/x/web.1-r3-a1b2c3.log"); got != "web.1[r3]" {
		t.Errorf("logPrefix = %q", got)
	}
	if got := logPrefix("/x/my-worker.2-r10-a1b2c3.log"); got != "my-worker.2[r10]" {
		t.Errorf("logPrefix = %q", got)
	}
}

func TestRotateKeepsOnePreviousFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.1-r1-abcdef.log")
	big := strings.Repeat("old line\n", 1000)
	if err := os.WriteFile(path, []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rotate(path, 4096); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("current log is %d bytes after rotation", fi.Size())
	}
	if prev, _ := os.ReadFile(path + ".1"); string(prev) != big {
		t.Fatalf("previous log has %d bytes, want %d", len(prev), len(big))
	}
	// An appending writer (as the shim is) continues at the start of the file.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("new line\n")
	f.Close()
	if got := tailLines(path, 2); len(got) != 2 || got[0] != "old line" || got[1] != "new line" {
		t.Fatalf("tail across the rotation: %q", got)
	}
	// Small files are left alone.
	if err := rotate(path, 4096); err != nil {
		t.Fatal(err)
	}
	if prev, _ := os.ReadFile(path + ".1"); string(prev) != big {
		t.Fatal("a small log was rotated")
	}
}

// ReadLogs needs only the state directory: the last N lines of each instance, one
// process type when asked, and with Follow the lines written afterwards.
func TestReadLogs(t *testing.T) {
	state := t.TempDir()
	key := types.NamespacedName{Namespace: "ns", Name: "shop"}
	dir := filepath.Join(state, "logs", "ns", "shop")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	web := filepath.Join(dir, "web.1-r3-aaaaaa.log")
	os.WriteFile(web, []byte("w1\nw2\nw3\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "worker.1-r3-bbbbbb.log"), []byte("k1\nk2\n"), 0o600)
	var buf bytes.Buffer
	if err := ReadLogs(context.Background(), state, key, LogOptions{Lines: 2}, &buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"web.1[r3]: w2\nweb.1[r3]: w3\n", "worker.1[r3]: k1\nworker.1[r3]: k2\n"} {
		if !strings.Contains(buf.String(), want) || strings.Contains(buf.String(), "w1") {
			t.Fatalf("ReadLogs -n 2:\n%s", buf.String())
		}
	}
	buf.Reset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	pr, pw := io.Pipe()
	go func() {
		done <- ReadLogs(ctx, state, key, LogOptions{Follow: true, Lines: 1, Process: "web"}, pw)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
		if len(got) == 1 {
			// The recent line is out, so the follower has taken the file's
			// offset: w4 comes from following.
			f, _ := os.OpenFile(web, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString("w4\n")
			f.Close()
		}
		if len(got) == 2 {
			cancel()
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != "web.1[r3]: w3|web.1[r3]: w4" {
		t.Fatalf("ReadLogs -f --process web: %q", got)
	}
}

func TestUIDRangesArePersistedPerAppAndNotReusedAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	const base = 1 << 30
	s, err := openStore(path, 20000, 20010, base, 3)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.ids("ns/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ids("ns/b")
	if err != nil {
		t.Fatal(err)
	}
	if a == b || a < base || b < base || (a-base)%IDRangeSize != 0 || (b-base)%IDRangeSize != 0 {
		t.Fatalf("ranges a %d, b %d: want distinct multiples of %d from %d", a, b, IDRangeSize, base)
	}
	if again, _ := s.ids("ns/a"); again != a {
		t.Fatalf("a's range moved from %d to %d", a, again)
	}
	// A restart sees them.
	s2, err := openStore(path, 20000, 20010, base, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s2.ids("ns/b"); got != b {
		t.Fatalf("after reopen b has %d, want %d", got, b)
	}
	// A freed range goes to no one before the unused one.
	if err := s2.freeIDs("ns/a"); err != nil {
		t.Fatal(err)
	}
	c, err := s2.ids("ns/c")
	if err != nil {
		t.Fatal(err)
	}
	if c == a || c == b {
		t.Fatalf("c got %d, a range given before (a %d, b %d) while one was never used", c, a, b)
	}
	d, err := s2.ids("ns/d") // only a's old range is left
	if err != nil || d != a {
		t.Fatalf("d got %d, %v; want the freed %d", d, err, a)
	}
	if _, err := s2.ids("ns/e"); err == nil || !strings.Contains(err.Error(), "no free uid range") {
		t.Fatalf("a fourth app in 3 ranges: %v", err)
	}
	// Adoption records a container's range for an app the file does not know.
	if err := s2.freeIDs("ns/c"); err != nil {
		t.Fatal(err)
	}
	if err := s2.reserveIDs("ns/x", c); err != nil {
		t.Fatal(err)
	}
	if got, _ := s2.ids("ns/x"); got != c {
		t.Fatalf("adopted range %d, want %d", got, c)
	}
}

func TestIDRangeConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StateDir = "/x"
	if cfg.IDBase != 1<<30 || cfg.IDRanges != 4096 || cfg.Validate() != nil {
		t.Fatalf("defaults %d %d: %v", cfg.IDBase, cfg.IDRanges, cfg.Validate())
	}
	cfg.IDBase = 1000
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "uid base 1000") {
		t.Fatalf("a base among the host's users: %v", err)
	}
	cfg = Config{StateDir: "/x", IDBase: 1 << 31, IDRanges: 1 << 15}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "ending below 2^32-1") {
		t.Fatalf("ranges past 2^32: %v", err)
	}
}

// A new instance is checked every probeFast at most for probeFastFor, then ever
// more slowly up to every 250 ms.
func TestProbeIntervalIsFastWhileTheInstanceIsNew(t *testing.T) {
	var waited time.Duration
	interval := 5 * time.Millisecond
	for waited < probeFastFor {
		if interval > probeFast {
			t.Fatalf("after %s of checks the interval is %s, more than %s", waited, interval, probeFast)
		}
		waited += interval
		interval = probeInterval(interval, waited)
	}
	for range 10 {
		waited += interval
		interval = probeInterval(interval, waited)
	}
	if interval != 250*time.Millisecond {
		t.Fatalf("a slow boot is checked every %s, want 250ms", interval)
	}
}
