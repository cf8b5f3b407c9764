package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/volumearchive/archivetest"
)

// sshIO runs a bex command over ssh with stdin from in and returns stdout,
// stderr and the exit error.
func (p *platform) sshIO(t *testing.T, in []byte, args ...string) ([]byte, string, error) {
	t.Helper()
	fields := strings.Fields(p.sshCommand())
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", p.port(p.sshAddr), "git@127.0.0.1"), quoteWords(args)...)...)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.String(), err
}

// mustSSH runs a bex command and fails the test when it fails.
func (p *platform) mustSSH(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := p.ssh(t, quoteWords(args)...)
	if err != nil {
		t.Fatalf("ssh %s: %v\nstdout %s\nstderr %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// TestVolumes: a volume end to end with bex up, the real ssh and git. A file the
// app writes into its volume (through `run`) is served by the web instance, and
// is there after a redeploy, a rollback, a suspend/resume and a restart of bex;
// writes past its size fail with ENOSPC inside the app and the app keeps
// serving; another app sees nothing of it; backup → destroy → create → restore
// gives the same bytes; hostile archives are refused and change nothing; the
// app's deletion takes its volume and leaves nothing mounted.
func TestVolumes(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	p.start(t)
	app := p.newRepo(t, "hello-shell", "vol-app")
	if out, err := app.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}

	// Bad names and paths: one line each, nothing made.
	for _, bad := range [][]string{
		{"volumes:create", "vol-app", "../x", "--path", "/data"},
		{"volumes:create", "vol-app", "a/b", "--path", "/data"},
		{"volumes:create", "vol-app", "data", "--path", "../etc"},
		{"volumes:create", "vol-app", "data", "--path", "/data/../etc"},
		{"volumes:create", "vol-app", "data", "--path", "/proc/self"},
		{"volumes:create", "vol-app", "data", "--path", "/"},
		{"volumes:create", "vol-app", "data"},
		{"volumes:create", "vol-app", "data", "--path", "/data", "--size", "1Mi"},
		{"volumes:create", "vol-app", "data", "--path", "/data", "--process", "../web"},
	} {
		out, errOut, err := p.ssh(t, quoteWords(bad)...)
		if err == nil || !strings.HasPrefix(errOut, "bex: ") || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%v: %v, stdout %q, stderr %q: want one line of refusal", bad, err, out, errOut)
		}
	}
	// A volume the disk has no room for: refused, and not left in the spec.
	out, errOut, err := p.ssh(t, "volumes:create", "vol-app", "huge", "--path", "/huge", "--size", "16Ti")
	if err == nil || !strings.Contains(errOut, "could not be made") || !strings.Contains(errOut, "free") {
		t.Fatalf("a 16Ti volume: %v %q %q", err, out, errOut)
	}
	if out := p.mustSSH(t, "volumes", "vol-app"); !strings.Contains(out, "has no volumes") {
		t.Fatalf("the volume that could not be made is listed: %q", out)
	}

	// hello-shell's httpd serves /www: a volume at /www/data is readable at /data.
	out, errOut, err = p.ssh(t, "volumes:create", "vol-app", "data", "--path", "/www/data", "--size", "16Mi")
	if err != nil || out != "Created the volume data (16Mi) of vol-app, mounted at /www/data.\n" || !strings.Contains(errOut, "-----> Making data (16Mi) and mounting it at /www/data") {
		t.Fatalf("volumes:create: %v\nstdout %q\nstderr %q", err, out, errOut)
	}
	if out := p.mustSSH(t, "run", "vol-app", "--", "sh", "-c", "echo kept > /www/data/f && stat -c '%u %a' /www/data"); out != "0 755\n" {
		t.Fatalf("run writes into the volume: %q", out)
	}
	kept := func(what string) {
		t.Helper()
		testenv.Eventually(t, time.Minute, what+": the web instance serves the volume's file", p.answers("vol-app", "/data/f", "kept"))
	}
	kept("created")

	app.commit(t, "a change", map[string]string{"CHANGED": "yes\n"})
	if out, err := app.push(); err != nil {
		t.Fatalf("redeploy: %v\n%s", err, out)
	}
	kept("after a redeploy")
	p.mustSSH(t, "rollback", "vol-app")
	kept("after a rollback")
	p.mustSSH(t, "suspend", "vol-app")
	testenv.Eventually(t, time.Minute, "suspended", func() error {
		if code, _, err := p.https("vol-app", "/data/f"); err != nil || code != 503 {
			return fmt.Errorf("%d %v", code, err)
		}
		return nil
	})
	p.mustSSH(t, "resume", "vol-app")
	kept("after suspend and resume")

	// bex up stops (the app's containers go, the volume is unmounted) and
	// starts again: the volume is mounted again before the app comes back.
	p.stop(t)
	if mounts := p.bexMounts(t); len(mounts) != 0 {
		t.Fatalf("mounted after bex up stopped: %v", mounts)
	}
	p.start(t)
	kept("after a restart of bex")

	// Full: ENOSPC inside, the app keeps serving.
	out = p.mustSSH(t, "run", "vol-app", "--", "sh", "-c", "dd if=/dev/zero of=/www/data/big bs=1M count=64 2>&1; echo exit=$?")
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "exit=0") {
		t.Fatalf("64 MiB into 16 MiB: %q", out)
	}
	var list []struct {
		Name      string `json:"name"`
		Path      string `json:"path"`
		SizeBytes int64  `json:"sizeBytes"`
		UsedBytes *int64 `json:"usedBytes"`
		Ready     bool   `json:"ready"`
	}
	if err := json.Unmarshal([]byte(p.mustSSH(t, "volumes", "vol-app", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "data" || list[0].Path != "/www/data" || list[0].SizeBytes != 16<<20 || !list[0].Ready ||
		list[0].UsedBytes == nil || *list[0].UsedBytes < 12<<20 {
		t.Fatalf("volumes --json when full: %s", p.mustSSH(t, "volumes", "vol-app", "--json"))
	}
	kept("with the volume full")
	p.mustSSH(t, "run", "vol-app", "--", "rm", "/www/data/big")

	// Another app: nothing of vol-app's volume, by path or by name.
	other := p.newRepo(t, "hello-shell", "vol-other")
	if out, err := other.push(); err != nil {
		t.Fatalf("push vol-other: %v\n%s", err, out)
	}
	out, _, _ = p.ssh(t, quoteWords([]string{"run", "vol-other", "--", "sh", "-c", "ls -A /www/data; cat /www/data/f; ls /run/bex; echo end"})...)
	if strings.Contains(out, "kept") || !strings.HasSuffix(out, "end\n") {
		t.Fatalf("vol-other's view: %q", out)
	}
	if _, errOut, err := p.ssh(t, "volumes:backup", "vol-other", "data"); err == nil || !strings.Contains(errOut, "vol-other has no volumes") {
		t.Fatalf("vol-other backs up vol-app's volume by name: %v %q", err, errOut)
	}

	// backup → destroy → create → restore: the same bytes.
	backup, errOut, err := p.sshIO(t, nil, "volumes:backup", "vol-app", "data")
	if err != nil || len(backup) == 0 {
		t.Fatalf("volumes:backup: %v %q", err, errOut)
	}
	if names := archivetest.Names(backup); strings.Join(names, " ") != "f" {
		t.Fatalf("the backup holds %q", names)
	}
	if _, errOut, err := p.ssh(t, "volumes:destroy", "vol-app", "data"); err == nil || !strings.Contains(errOut, "--confirm data") {
		t.Fatalf("volumes:destroy without --confirm: %v %q", err, errOut)
	}
	p.mustSSH(t, "volumes:destroy", "vol-app", "data", "--confirm", "data")
	p.mustSSH(t, "volumes:create", "vol-app", "data", "--path", "/www/data", "--size", "16Mi")
	if out := p.mustSSH(t, "run", "vol-app", "--", "ls", "-A", "/www/data"); out != "" {
		t.Fatalf("a volume made again is not empty: %q", out)
	}
	if _, errOut, err := p.sshIO(t, backup, "volumes:restore", "vol-app", "data"); err != nil {
		t.Fatalf("volumes:restore: %v %q", err, errOut)
	}
	kept("after the restore")
	again, _, err := p.sshIO(t, nil, "volumes:backup", "vol-app", "data")
	if err != nil || !bytes.Equal(again, backup) {
		t.Fatalf("the backup after the restore differs (%d and %d bytes, %v)", len(again), len(backup), err)
	}

	// Hostile archives: refused, nothing changes.
	for name, archive := range map[string][]byte{
		"../x":          archivetest.FineThen(t, "../x"),
		"absolute path": archivetest.FineThen(t, "/tmp/bex-e2e-escaped"),
		"garbage":       []byte(strings.Repeat("not a tar ", 100)),
	} {
		_, errOut, err := p.sshIO(t, archive, "volumes:restore", "vol-app", "data")
		if err == nil || !strings.Contains(errOut, "refused the archive") {
			t.Errorf("%s: volumes:restore %v %q", name, err, errOut)
		}
		if again, _, _ := p.sshIO(t, nil, "volumes:backup", "vol-app", "data"); !bytes.Equal(again, backup) {
			t.Errorf("%s: the volume changed", name)
		}
	}
	if _, err := os.Stat("/tmp/bex-e2e-escaped"); err == nil {
		t.Errorf("an absolute path was written on the host")
	}

	// The app's deletion takes its volume.
	p.mustSSH(t, "apps:destroy", "vol-app", "--confirm", "vol-app")
	p.mustSSH(t, "apps:destroy", "vol-other", "--confirm", "vol-other")
	testenv.Eventually(t, time.Minute, "nothing mounted after the apps' deletion", func() error {
		if m := p.bexMounts(t); len(m) != 0 {
			return fmt.Errorf("mounted: %v", m)
		}
		if _, err := os.Stat(filepath.Join(p.dir, "runtime", "volumes", "default", "vol-app")); !os.IsNotExist(err) {
			return fmt.Errorf("vol-app's volume images: %v", err)
		}
		return nil
	})
}

// bexMounts lists the volumes of this platform's state dir that are mounted.
func (p *platform) bexMounts(t *testing.T) []string {
	t.Helper()
	root := filepath.Dir(filepath.Dir(filepath.Dir(local.Config{StateDir: filepath.Join(p.dir, "runtime")}.VolumeDir(types.NamespacedName{Namespace: "ns", Name: "app"}, "vol"))))
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], root+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
