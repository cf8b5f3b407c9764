package local

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/volumearchive/archivetest"
)

// TestInstanceSeesOnlyItsOwnNetworkDevices: beside another instance (whose
// veth the host has), a probe one-off lists /sys/class/net and
// /sys/devices/virtual/net and reads its eth0's address and byte counter
// there: it sees lo and its own eth0 only (the address ip(8) gives it, over
// netlink), none of the host's devices, no tenant's veth.
func TestInstanceSeesOnlyItsOwnNetworkDevices(t *testing.T) {
	f := newFixture(t, uniqueName("sysfs-net"))
	d := f.desired(1, f.v1, 1)
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c",
		`echo "$(ls /sys/class/net | tr '\n' ' ')| $(ls /sys/devices/virtual/net | tr '\n' ' ')| $(cat /sys/class/net/eth0/address)" > /www/net; exec httpd -f -p $PORT -h /www`}}}
	f.syncUntil(d, time.Minute, "rolled out", rolledOut)
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	web, err := get(eps[0] + "/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the web instance saw: %s", web)
	webView := strings.Split(strings.TrimSpace(web), "| ")
	if len(webView) != 3 || webView[0] != "eth0 lo " || webView[1] != "eth0 lo " || len(webView[2]) != 17 {
		t.Errorf("the web instance's /sys/class/net and /sys/devices/virtual/net: %q, want its own eth0 and lo only", web)
	}
	var veths []string
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "veth") {
			veths = append(veths, e.Name())
		}
	}
	if len(veths) == 0 {
		t.Fatalf("the host has no veth beside a running instance: %v", ents)
	}
	o := f.newOneOffs()
	exit, out := f.run(o, f.app, `echo "class: $(ls /sys/class/net | tr '\n' ' ')"
echo "virtual: $(ls /sys/devices/virtual/net | tr '\n' ' ')"
echo "devices: $(find /sys/devices -path '*/net/*' -maxdepth 6 -name address 2>/dev/null | wc -l)"
echo "address: $(cat /sys/class/net/eth0/address) $(ip -o link show eth0 | sed 's/.*ether \([^ ]*\).*/\1/')"
echo "rx: $(cat /sys/class/net/eth0/statistics/rx_bytes)"`)
	t.Logf("the host has %d devices, %d of them veths; the probe saw:\n%s", len(ents), len(veths), out)
	if exit != 0 {
		t.Fatalf("probe: exit %d\n%s", exit, out)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, ": ")
		lines[k] = strings.TrimSpace(v)
	}
	if lines["class"] != "eth0 lo" || lines["virtual"] != "eth0 lo" {
		t.Errorf("/sys/class/net %q, /sys/devices/virtual/net %q: want its own eth0 and lo only", lines["class"], lines["virtual"])
	}
	// lo and eth0: each device's address file, wherever it sits in /sys/devices.
	if lines["devices"] != "2" {
		t.Errorf("network devices under /sys/devices: %s, want 2 (lo and eth0)", lines["devices"])
	}
	if a := strings.Fields(lines["address"]); len(a) != 2 || a[0] != a[1] || len(a[0]) != 17 {
		t.Errorf("eth0's address in /sys and from ip: %q, want the same", lines["address"])
	}
	if n, err := strconv.ParseInt(lines["rx"], 10, 64); err != nil || n < 0 {
		t.Errorf("eth0's rx_bytes: %q", lines["rx"])
	}
	if len(webView) == 3 && strings.Contains(lines["address"], webView[2]) {
		t.Errorf("the one-off sees the web instance's eth0 (%s)", webView[2])
	}
	for _, v := range veths {
		if strings.Contains(out, v) || strings.Contains(web, v) {
			t.Errorf("the probe sees the host's %s", v)
		}
	}
}

// TestSysfsOfANamespace: the sysfs the runtime mounts for a namespace shows
// that namespace's devices (a new one has lo only), read-only, and goes with
// unmountSysfs.
func TestSysfsOfANamespace(t *testing.T) {
	dir := t.TempDir()
	netns := filepath.Join(dir, "netns")
	if err := tenantnet.NewNetNS(netns); err != nil {
		t.Fatal(err)
	}
	defer tenantnet.RemoveNetNS(netns)
	sys := filepath.Join(dir, "sys")
	start := time.Now()
	if err := mountSysfs(netns, sys); err != nil {
		t.Fatal(err)
	}
	t.Logf("mounted in %s", time.Since(start))
	ents, err := os.ReadDir(filepath.Join(sys, "class/net"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "lo" {
		t.Errorf("a new namespace's sysfs shows %v, want lo only", ents)
	}
	if err := os.WriteFile(filepath.Join(sys, "kernel/uevent_helper"), []byte("x"), 0o644); err == nil {
		t.Error("the sysfs is writable")
	}
	if err := unmountSysfs(sys); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(sys); err != nil || len(ents) != 0 {
		t.Errorf("after unmountSysfs: %v %v", ents, err)
	}
}

// TestTenantsShareOnePidsLimit: the tenants' parent cgroup has pids.max set,
// half the host's pid_max by default; with a limit of 120 a one-off that forks
// 400 sleeps gets fewer than 120, with the kernel's EAGAIN, though its own
// cgroup allows 4096; an ordinary instance started under the same limit
// serves before and after, and a one-off after it runs.
func TestTenantsShareOnePidsLimit(t *testing.T) {
	f := newFixture(t, uniqueName("tenant-pids"))
	pidMax, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(pidMax)), 10, 64)
	if got := readPidsMax(t, f.cfg.Namespace); got != strconv.FormatInt(n/2, 10) {
		t.Errorf("the default tenants' cgroup %s: pids.max %s, want half of pid_max %d", f.cfg.Namespace, got, n)
	}

	// A parent of this test's own: the limit is the machine's, not the process's.
	f.rt.Close()
	f.cfg.CgroupParent, f.cfg.TenantsPidsMax = fmt.Sprintf("bex-test-pids-%d", os.Getpid()), 120
	f.rt = f.newRuntime()
	dir, err := tenantsPidsDir(f.cfg.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = f.rt.Delete(ctx, f.key())
		// runc made the parent in every hierarchy.
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", f.cfg.CgroupParent))
		for _, d := range append(dirs, dir) {
			_ = syscall.Rmdir(d)
		}
	})
	if got := readPidsMax(t, f.cfg.CgroupParent); got != "120" {
		t.Fatalf("pids.max of %s: %s, want 120", dir, got)
	}
	f.syncUntil(f.desired(1, f.v1, 1), time.Minute, "rolled out", rolledOut)
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	if _, err := get(eps[0] + "/"); err != nil {
		t.Fatalf("an ordinary instance under the limit: %v", err)
	}
	o := f.newOneOffs()
	// The forks happen in an inner shell, which dies at its first failed
	// fork; the outer one reports with builtins only (no fork left).
	exit, out := f.run(o, f.app, `sh -c 'i=0; while [ $i -lt 400 ]; do sleep 60 & i=$((i+1)); echo $i > /tmp/n; done' 2>/tmp/err
read n < /tmp/n; read e < /tmp/err; read own < /sys/fs/cgroup/pids/pids.max || read own < /sys/fs/cgroup/pids.max
echo "forked $n"; echo "own $own"; echo "error $e"`)
	t.Logf("exit %d:\n%s", exit, out)
	var forked int
	if _, err := fmt.Sscanf(out, "forked %d", &forked); err != nil {
		t.Fatalf("the fork probe's report: %q", out)
	}
	if forked >= 120 || forked < 60 {
		t.Errorf("forked %d sleeps, want under the tenants' 120 (and most of them)", forked)
	}
	if !strings.Contains(out, "own 4096") {
		t.Errorf("the one-off's own cgroup: want pids.max 4096: %q", out)
	}
	if !strings.Contains(out, "can't fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("the failed fork's error: %q", out)
	}
	if _, err := get(eps[0] + "/"); err != nil {
		t.Errorf("the instance after the fork bomb: %v", err)
	}
	if exit, out := f.run(o, f.app, "echo ok"); exit != 0 || out != "ok\n" {
		t.Errorf("a one-off after the fork bomb: exit %d %q", exit, out)
	}
}

func readPidsMax(t *testing.T, parent string) string {
	t.Helper()
	dir, err := tenantsPidsDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pids.max"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestRestoreKeepsOwnersInTheAppsRange: the app chowns its volume's root to
// the last id of its range (host base+65535), which a restore once took as
// the archive's base; an archive whose entries carry that id, ids past 65535
// and a huge one lands with every file inside the app's range: ids 0..65535
// at the recorded base, the others at its root. Control: an ordinary backup
// and restore keeps each file's ids, the root chowned or not.
func TestRestoreKeepsOwnersInTheAppsRange(t *testing.T) {
	f := newFixture(t, uniqueName("restore-ids"))
	o := f.newOneOffs()
	vols := []appv1.Volume{dataVolume("32Mi")}
	f.app.Spec.Volumes = vols
	d := f.desired(1, f.v1, 1)
	d.Volumes = vols
	f.syncUntil(d, time.Minute, "release 1 with a volume", rolledOut)
	dir := f.cfg.VolumeDir(f.key(), "data")
	base, ok := f.rt.store.knownIDs(f.key().String())
	if !ok {
		t.Fatal("no uid range recorded")
	}
	exit, out := f.run(o, f.app, `set -e; cd `+volPath+`
mkdir d && echo a > d/f && chown 1000:1001 d/f && echo b > g && chown 65535:65535 g
chown 65535:65535 . && echo ok`)
	if exit != 0 || out != "ok\n" {
		t.Fatalf("fill the volume: exit %d, %q", exit, out)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil || st.Uid != base+65535 {
		t.Fatalf("the app's chown of its volume's root: uid %d (%v), want %d", st.Uid, err, base+65535)
	}
	want := archivetest.Tree(t, dir, base)

	vs, err := NewVolumes(f.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	ctx := context.Background()
	var backup bytes.Buffer
	if err := vs.Backup(ctx, f.key(), "data", &backup); err != nil {
		t.Fatal(err)
	}
	if h := tarHeaders(backup.Bytes()); !strings.Contains(h, "d/f 0 644 1000:1001 ") || !strings.Contains(h, "g 0 644 65535:65535 ") {
		t.Fatalf("the backup's ids are not the container's:\n%s", h)
	}
	if err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(backup.Bytes())); err != nil {
		t.Fatal(err)
	}
	if got := archivetest.Tree(t, dir, base); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("an ordinary round trip changed the volume:\n%v\nwant:\n%v", got, want)
	}

	hostile := archivetest.TarOf(t,
		tar.Header{Name: "top", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 65535, Gid: 65535, Linkname: "x"},
		tar.Header{Name: "past/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 65536, Gid: 70000},
		tar.Header{Name: "past/huge", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1 << 31, Gid: 4294967295, Linkname: "y"},
		tar.Header{Name: "implicit/parent/file", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1, Gid: 1, Linkname: "z"},
		tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "top", Uid: 131071, Gid: 131071},
	)
	if err := vs.Restore(ctx, f.key(), "data", bytes.NewReader(hostile)); err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if st.Uid < base || st.Uid-base >= IDRangeSize || st.Gid < base || st.Gid-base >= IDRangeSize {
			t.Errorf("%s is owned by %d:%d, outside the app's range %d..%d", rel, st.Uid, st.Gid, base, base+IDRangeSize-1)
		}
		owners[rel] = fmt.Sprintf("%d:%d", int64(st.Uid)-int64(base), int64(st.Gid)-int64(base))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var paths, got []string
	for k := range owners {
		paths = append(paths, k)
	}
	sort.Strings(paths)
	for _, k := range paths {
		got = append(got, k+"="+owners[k])
	}
	if w := "implicit=0:0 implicit/parent=0:0 implicit/parent/file=1:1 link=0:0 past=0:0 past/huge=0:0 top=65535:65535"; strings.Join(got, " ") != w {
		t.Errorf("owners (relative to the recorded base) %v, want %s", got, w)
	}
}
