package local

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

// syncBuffer is safe for the copy goroutines and the test.
type syncBuffer = testenv.SyncBuffer

func (f *fixture) newOneOffs() *OneOffs {
	f.t.Helper()
	o, err := NewOneOffs(f.cfg, f.k8s, "test", nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { o.Close() })
	return o
}

func (f *fixture) oneOff(cmd ...string) runtime.OneOff {
	id := runtime.NewOneOffID()
	return runtime.OneOff{App: f.app, ID: id, Process: "run." + id, Release: 1, Image: f.v1, Command: cmd,
		Env: []appv1.EnvVar{{Name: "GREETING", Value: "hello"}}}
}

// noOneOffLeft checks that no container of the app and no network namespace of
// the one-offs is left.
func (f *fixture) noOneOffLeft() {
	f.t.Helper()
	if ctrs := f.containers(); len(ctrs) != 0 {
		f.t.Errorf("containers left: %v", ctrs)
	}
	entries, err := os.ReadDir(filepath.Join(f.cfg.StateDir, "net-oneoff", "test"))
	if err != nil {
		f.t.Fatal(err)
	}
	if len(entries) != 0 {
		f.t.Errorf("network namespaces left: %v", entries)
	}
}

func TestOneOffRunExitStdinTimeout(t *testing.T) {
	f := newFixture(t, "oneoff-run")
	o := f.newOneOffs()
	ctx := context.Background()

	var out, errb syncBuffer
	oo := f.oneOff("sh", "-c", `echo "out $GREETING $PORT"; echo err >&2; exit 3`)
	oo.Stdout, oo.Stderr = &out, &errb
	exit, err := o.Run(ctx, oo)
	if err != nil || exit != 3 {
		t.Fatalf("exit %d, %v", exit, err)
	}
	if out.String() != fmt.Sprintf("out hello %d\n", oneOffPort) || errb.String() != "err\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
	f.noOneOffLeft()
	// The log is kept under the process name.
	var logs bytes.Buffer
	if err := ReadLogs(ctx, f.cfg.StateDir, f.key(), LogOptions{Process: oo.Process}, &logs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), oo.Process+"[r1]: out hello") || !strings.Contains(logs.String(), oo.Process+"[r1]: err") {
		t.Errorf("logs --process %s: %q", oo.Process, logs.String())
	}

	// Stdin from a pipe reaches the process, and its end too (cat returns).
	out = syncBuffer{}
	oo = f.oneOff("sh", "-c", "cat; echo done")
	oo.Stdin, oo.Stdout = strings.NewReader("hi\nthere\n"), &out
	if exit, err := o.Run(ctx, oo); err != nil || exit != 0 {
		t.Fatalf("cat: exit %d, %v", exit, err)
	}
	if out.String() != "hi\nthere\ndone\n" {
		t.Errorf("cat: %q", out.String())
	}

	// The log is bounded: a run printing 1 MB keeps at most twice LogMaxBytes
	// (the default 10 MiB is set down to 64 KiB for this OneOffs).
	small := f.cfg
	small.LogMaxBytes = 64 << 10
	os2, err := NewOneOffs(small, f.k8s, "test-small", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer os2.Close()
	oo = f.oneOff("sh", "-c", `i=0; while [ $i -lt 1000 ]; do head -c 999 /dev/zero | tr '\0' x; echo; i=$((i+1)); done; echo last-line`)
	var n countingWriter
	oo.Stdout = &n
	if exit, err := os2.Run(ctx, oo); err != nil || exit != 0 {
		t.Fatalf("big output: exit %d, %v", exit, err)
	}
	logPath := os2.oneOffLog(f.key(), oo)
	var kept int64
	for _, p := range []string{logPath, logPath + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		kept += fi.Size()
	}
	if n.n != 1_000_000+len("last-line\n") || kept > 2*small.LogMaxBytes || kept < small.LogMaxBytes {
		t.Errorf("streamed %d bytes, kept %d in the log (max %d)", n.n, kept, 2*small.LogMaxBytes)
	}
	if tail := tailLines(logPath, 1); len(tail) != 1 || tail[0] != "last-line" {
		t.Errorf("the log's last line: %q", tail)
	}

	// Timeout kills: 137.
	oo = f.oneOff("sleep", "100")
	oo.Timeout = time.Second
	start := time.Now()
	if exit, err := o.Run(ctx, oo); err != nil || exit != 137 {
		t.Fatalf("timeout: exit %d, %v", exit, err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("timeout of 1s took %v", d)
	}
	f.noOneOffLeft()
}

func TestOneOffTTYResizeAndCtrlC(t *testing.T) {
	f := newFixture(t, "oneoff-tty")
	o := f.newOneOffs()
	ctx := context.Background()

	// The size, then a resize seen by the process (it polls its own size), and
	// TERM.
	var out syncBuffer
	resize := make(chan runtime.WindowSize)
	oo := f.oneOff("sh", "-c", `stty size; echo "term=$TERM"; i=0
while [ "$(stty size)" != "30 100" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
stty size; exit 4`)
	oo.Stdout = &out
	oo.TTY = &runtime.TTY{Term: "xterm-256color", Width: 80, Height: 24, Resize: resize}
	type result struct {
		exit int
		err  error
	}
	res := make(chan result, 1)
	go func() {
		exit, err := o.Run(ctx, oo)
		res <- result{exit, err}
	}()
	testenv.Eventually(t, time.Minute, "the first size", func() error {
		if !strings.Contains(out.String(), "term=xterm-256color") {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
	if !strings.Contains(out.String(), "24 80") {
		t.Errorf("first stty size: %q", out.String())
	}
	resize <- runtime.WindowSize{Width: 100, Height: 30}
	r := <-res
	if r.err != nil || r.exit != 4 {
		t.Fatalf("exit %d, %v; output %q", r.exit, r.err, out.String())
	}
	if strings.Count(out.String(), "30 100") != 1 || strings.Index(out.String(), "30 100") < strings.Index(out.String(), "term=") {
		t.Errorf("stty size after the resize: %q", out.String())
	}

	// Ctrl-C: 0x03 on stdin interrupts sleep (SIGINT: 130). Not sleep as the
	// command itself: the command is pid 1 of its namespace, which the kernel
	// spares the signals it has no handler for, as in any container.
	inR, inW := io.Pipe()
	out = syncBuffer{}
	oo = f.oneOff("sh", "-c", `sleep 100; echo "sleep: $?"; exit 7`)
	oo.Stdin, oo.Stdout = inR, &out
	oo.TTY = &runtime.TTY{Term: "xterm", Width: 80, Height: 24}
	go func() {
		exit, err := o.Run(ctx, oo)
		res <- result{exit, err}
	}()
	// Sent until the run ends: a 0x03 before sleep runs interrupts nothing.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for done := false; !done; {
		select {
		case r = <-res:
			done = true
		case <-tick.C:
			// Not in this loop: once the run ended nothing reads stdin, and a
			// write here would block before res is seen (inW.Close ends it).
			go func() { _, _ = inW.Write([]byte{3}) }()
		case <-deadline:
			t.Fatal("Ctrl-C did not end sleep within a minute")
		}
	}
	inW.Close()
	// busybox sh, seeing its child die of SIGINT, ends as interrupted too (130);
	// without the interrupt it would print and exit 7.
	if r.err != nil || r.exit != 130 || strings.Contains(out.String(), "sleep: 0") {
		t.Fatalf("Ctrl-C: exit %d, %v, output %q", r.exit, r.err, out.String())
	}
	f.noOneOffLeft()
}

func TestOneOffStartConfinedAndLeftoversRemoved(t *testing.T) {
	f := newFixture(t, "oneoff-start")
	o := f.newOneOffs()
	ctx := context.Background()
	lo := listenOnHost(t, "127.0.0.1:0")
	any := listenOnHost(t, "0.0.0.0:0")
	hostIP := hostAddress(t)

	oo := f.oneOff("sh", "-c", fmt.Sprintf(`echo "uidmap: $(tr -s ' ' < /proc/self/uid_map)"; echo "id: $(id -u)"
echo "lo: $(nc -w 2 127.0.0.1 %d </dev/null 2>&1 | head -c 100)"
echo "host: $(nc -w 2 %s %d </dev/null 2>&1 | head -c 100)"`, lo.port(), hostIP, any.port()))
	exitC := make(chan int, 1)
	if err := o.Start(ctx, oo, func(exit int) { exitC <- exit }); err != nil {
		t.Fatal(err)
	}
	select {
	case exit := <-exitC:
		if exit != 0 {
			t.Errorf("exit %d", exit)
		}
	case <-time.After(time.Minute):
		t.Fatal("done not called within a minute")
	}
	var logs bytes.Buffer
	if err := ReadLogs(ctx, f.cfg.StateDir, f.key(), LogOptions{Process: oo.Process}, &logs); err != nil {
		t.Fatal(err)
	}
	t.Logf("one-off's log:\n%s", logs.String())
	base, err := f.rt.store.ids(f.key().String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(logs.String()), " "), fmt.Sprintf("uidmap: 0 %d 65536", base)) {
		t.Errorf("uid map: not the app's range from %d: %q", base, logs.String())
	}
	if !strings.Contains(logs.String(), "id: 0") {
		t.Errorf("id: %q", logs.String())
	}
	if strings.Contains(logs.String(), hostSecret) {
		t.Errorf("the one-off reached a host listener: %q", logs.String())
	}
	tn := f.cfg.withDefaults().TenantNet
	if p := append(lo.fromTenants(tn), any.fromTenants(tn)...); len(p) > 0 {
		t.Errorf("host listeners accepted tenants: %v", p)
	}
	f.noOneOffLeft()

	// A one-off left by a process that went (Close does not wait for a
	// detached run here: the container is left as a crash would leave it) is
	// removed by the next OneOffs of the same owner; the Runtime ignores it.
	left := f.oneOff("sleep", "1000")
	if err := o.Start(ctx, left, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(f.containers()); n != 1 {
		t.Fatalf("%d containers, want the one-off", n)
	}
	rt2 := f.newRuntime() // adopts nothing of it, deletes nothing of it
	rt2.Close()
	if n := len(f.containers()); n != 1 {
		t.Fatalf("after a Runtime started: %d containers, want the one-off", n)
	}
	o.r.cd.Close() // as if the process had died: no removal
	f.newOneOffs()
	f.noOneOffLeft()
}

// TestStoreIsSharedAcrossProcesses opens two stores on one state file, as the
// deployer and the gitserver do: each change is made on the other's last write,
// so two apps never get the same uid range and neither store's write loses the
// other's.
func TestStoreIsSharedAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s1, err := openStore(path, 20000, 20010, 1<<30, 8)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := openStore(path, 20000, 20010, 1<<30, 8)
	if err != nil {
		t.Fatal(err)
	}
	s1.bindable = func(int) bool { return true }
	a, err := s1.ids("ns/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s2.ids("ns/b")
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatalf("apps a and b share the range at %d", a)
	}
	if _, err := s1.allocate("ctr"); err != nil {
		t.Fatal(err)
	}
	if got, err := s1.ids("ns/b"); err != nil || got != b {
		t.Errorf("s1 sees b at %d (%v), s2 gave %d", got, err, b)
	}
	if got, err := s2.ids("ns/a"); err != nil || got != a {
		t.Errorf("s2 sees a at %d (%v), s1 gave %d", got, err, a)
	}
}

func TestOneOffLogNames(t *testing.T) {
	for name, want := range map[string]string{
		"_run.0123456789ab-r3-0123456789ab.log": "run.0123456789ab",
		"_release-r1-abc.log":                   "release",
		"_cron.nightly-report-r12-abc.log":      "cron.nightly-report",
		"web.1-r3-abcdef.log":                   "web",
	} {
		if got := logProcess("/x/" + name); got != want {
			t.Errorf("logProcess(%s) = %q, want %q", name, got, want)
		}
	}
	if got := logPrefix("/x/_run.0123456789ab-r3-0123456789ab.log"); got != "run.0123456789ab[r3]" {
		t.Errorf("logPrefix: %q", got)
	}
}

type countingWriter struct{ n int }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// The first runs of an app's image, several at once, share the image's copy
// for the app's ids: the ones that find it being made wait for it, none fails
// ("already exists").
func TestOneOffFirstRunsAtOnce(t *testing.T) {
	f := newFixture(t, uniqueName("oneoff-many"))
	o := f.newOneOffs()
	ctx := context.Background()
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			exit, err := o.Run(ctx, f.oneOff("sh", "-c", fmt.Sprintf("exit %d", 10+i)))
			if err == nil && exit != 10+i {
				err = fmt.Errorf("run %d: exit %d", i, exit)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	f.noOneOffLeft()
}
