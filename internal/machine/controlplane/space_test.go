package controlplane_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/controlplane"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/testenv"
)

// etcdOnly runs the control plane's etcd (no API server: the test speaks to etcd
// itself) and returns its supervisor and a client etcd answers.
func etcdOnly(t *testing.T, cp *controlplane.ControlPlane) (*supervise.Supervisor, *http.Client) {
	t.Helper()
	sup := supervise.New(nil)
	if _, err := sup.Start(context.Background(), cp.Etcd()); err != nil {
		sup.Stop()
		t.Fatalf("etcd did not get ready: %v", err)
	}
	hc, err := cp.EtcdClient()
	if err != nil {
		t.Fatal(err)
	}
	return sup, hc
}

// etcdCall POSTs body to etcd's JSON gateway at path and returns the answer.
func etcdCall(hc *http.Client, cp *controlplane.ControlPlane, path, body string) (string, error) {
	resp, err := hc.Post(cp.EtcdURL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = fmt.Fprint(&b, resp.Status, " ")
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("%s", b.String())
	}
	return b.String(), nil
}

func put(hc *http.Client, cp *controlplane.ControlPlane, key string, value []byte) error {
	_, err := etcdCall(hc, cp, "/v3/kv/put", fmt.Sprintf(`{"key":%q,"value":%q}`,
		base64.StdEncoding.EncodeToString([]byte(key)), base64.StdEncoding.EncodeToString(value)))
	return err
}

// fillUntilNoSpace writes 256 KiB values (to one key, or to a new key each time)
// until etcd refuses a write for its quota, and checks that it raised the alarm.
func fillUntilNoSpace(t *testing.T, hc *http.Client, cp *controlplane.ControlPlane, distinct bool) {
	t.Helper()
	value := make([]byte, 256<<10)
	for i := 0; ; i++ {
		if i > 400 {
			t.Fatal("400 writes of 256 KiB and etcd did not refuse one for its quota")
		}
		key := "/fill/one"
		if distinct {
			key = fmt.Sprintf("/fill/%04d", i)
		}
		err := put(hc, cp, key, value)
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "database space exceeded") {
			t.Fatalf("write %d: %v", i, err)
		}
		break
	}
	if out, err := etcdCall(hc, cp, "/v3/maintenance/alarm", `{"action":"GET"}`); err != nil || !strings.Contains(out, "NOSPACE") {
		t.Fatalf("after the refused write, etcd's alarms: %v %s", err, out)
	}
}

// TestEtcdRecoversFromItsSpaceQuota: etcd runs with bex's explicit space quota;
// a database that reaches it (a tiny quota here, filled by real writes) raises
// etcd's NOSPACE alarm and every write is refused. While running, WatchSpace
// compacts, defragments and disarms it, and writes work again; an alarm kept in
// the data dir across a restart does not keep etcd from getting ready, and is
// handled at the start; live data that does not fit keeps the alarm (and says so)
// until it is deleted.
func TestEtcdRecoversFromItsSpaceQuota(t *testing.T) {
	cfg := binaries(t)
	cfg.QuotaBackendBytes = 4 << 20
	cfg.AlarmInterval = 200 * time.Millisecond
	logs := &testenv.SyncBuffer{}
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	cp, err := controlplane.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(cp.Etcd().Args, " "), "--quota-backend-bytes 4194304") {
		t.Fatalf("etcd's arguments lack the quota: %q", cp.Etcd().Args)
	}
	sup, hc := etcdOnly(t, cp)
	defer func() { sup.Stop() }()
	const recovered = "compacted and defragmented, writes allowed again"

	// While running: history (one key rewritten) fills the quota.
	fillUntilNoSpace(t, hc, cp, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cp.WatchSpace(ctx); close(done) }()
	// Until WatchSpace has said what it did, not only until a write works: the
	// write can work as soon as the disarm lands, before WatchSpace has read etcd's
	// answer, and cancelling it then ended the disarm call as "canceled", unsaid.
	testenv.Eventually(t, 30*time.Second, "a write after WatchSpace handled the alarm, and its word on it", func() error {
		if err := put(hc, cp, "/after", []byte("x")); err != nil {
			return err
		}
		if !strings.Contains(logs.String(), recovered) {
			return fmt.Errorf("WatchSpace did not say what it did:\n%s", logs)
		}
		return nil
	})
	cancel()
	<-done

	// Across a restart: the alarm is in the data dir; etcd gets ready with it and
	// the start handles it.
	fillUntilNoSpace(t, hc, cp, false)
	if err := sup.Stop(); err != nil {
		t.Fatal(err)
	}
	mark := len(logs.String())
	sup, hc = etcdOnly(t, cp)
	if out, err := etcdCall(hc, cp, "/v3/maintenance/alarm", `{"action":"GET"}`); err != nil || strings.Contains(out, "NOSPACE") {
		t.Fatalf("after a restart, etcd's alarms: %v %s", err, out)
	}
	if err := put(hc, cp, "/after", []byte("y")); err != nil {
		t.Fatalf("a write after the restart: %v", err)
	}
	if !strings.Contains(logs.String()[mark:], recovered) {
		t.Fatalf("the start did not say what it did:\n%s", logs)
	}

	// Live data over the quota: compaction frees nothing, the alarm stays (etcd
	// still gets ready and serves reads), and deleting the data lets it go. The
	// data is written under a larger quota: filled up to the small one, where the
	// refusal falls depends on how bbolt grows its file (live data anywhere from
	// 2.9 to 4 MiB, under or over the 3/4 of the quota the alarm is disarmed
	// under), while 5 MiB of live data is over the quota whatever the file does.
	if err := sup.Stop(); err != nil {
		t.Fatal(err)
	}
	roomy := cfg
	roomy.QuotaBackendBytes = 64 << 20
	cpRoomy, err := controlplane.Prepare(roomy)
	if err != nil {
		t.Fatal(err)
	}
	sup, hc = etcdOnly(t, cpRoomy)
	value := make([]byte, 256<<10)
	for i := range 20 {
		if err := put(hc, cpRoomy, fmt.Sprintf("/fill/%04d", i), value); err != nil {
			t.Fatalf("write %d under the larger quota: %v", i, err)
		}
	}
	if err := sup.Stop(); err != nil {
		t.Fatal(err)
	}
	// Back under the small quota, the next write raises the alarm.
	sup, hc = etcdOnly(t, cp)
	if err := put(hc, cp, "/after", []byte("z")); err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("a write with 5 MiB of live data under a 4 MiB quota: %v, want it refused", err)
	}
	if err := sup.Stop(); err != nil {
		t.Fatal(err)
	}
	mark = len(logs.String())
	sup, hc = etcdOnly(t, cp)
	if !strings.Contains(logs.String()[mark:], "even after compaction and defragmentation: the API is read-only") {
		t.Fatalf("with live data over the quota, the start did not say the API is read-only:\n%s", logs)
	}
	if err := put(hc, cp, "/after", []byte("z")); err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("a write with live data over the quota: %v, want it refused", err)
	}
	if _, err := etcdCall(hc, cp, "/v3/kv/range", fmt.Sprintf(`{"key":%q}`, base64.StdEncoding.EncodeToString([]byte("/after")))); err != nil {
		t.Fatalf("a read under the alarm: %v", err)
	}
	if _, err := etcdCall(hc, cp, "/v3/kv/deleterange", fmt.Sprintf(`{"key":%q,"range_end":%q}`,
		base64.StdEncoding.EncodeToString([]byte("/fill/")), base64.StdEncoding.EncodeToString([]byte("/fill0")))); err != nil {
		t.Fatalf("a delete under the alarm: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go cp.WatchSpace(ctx)
	testenv.Eventually(t, 30*time.Second, "a write once the live data is deleted", func() error {
		return put(hc, cp, "/after", []byte("w"))
	})
}

// TestQuotaFor: etcd's quota is 5% of the file system of its data dir, between
// 64 MiB and etcd's own default of 2 GiB (tmpfs mounts of each size, nothing
// written to them).
func TestQuotaFor(t *testing.T) {
	for _, c := range []struct {
		size string
		want int64
	}{{"256m", 64 << 20}, {"4g", 4 << 30 / 20}, {"100g", 2 << 30}} {
		dir := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+c.size, "tmpfs", dir).CombinedOutput(); err != nil {
			t.Fatalf("mounting a tmpfs (the test needs root): %v\n%s", err, out)
		}
		got := controlplane.QuotaFor(dir)
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
		}
		if got != c.want {
			t.Errorf("QuotaFor(a %s file system) = %d, want %d", c.size, got, c.want)
		}
	}
}
