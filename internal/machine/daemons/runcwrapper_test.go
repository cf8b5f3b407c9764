package daemons

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeRunc is a runc stand-in for the wrapper: it records its arguments, answers
// `state` with the bundle of STATE_BUNDLE, and does nothing else.
const fakeRunc = `#!/bin/sh
for a in "$@"; do if [ "$a" = state ]; then printf '{"id":"x","bundle":"%s"}\n' "$STATE_BUNDLE"; exit 0; fi; done
printf '%s\n' "$@" > "$RECORD"
`

func writeSpec(t *testing.T, dir string, s specs.Spec) string {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readSpec(t *testing.T, path string) specs.Spec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	return s
}

func buildStepSpec(cgroupsPath string) specs.Spec {
	caps := []string{"CAP_CHOWN", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETUID"}
	return specs.Spec{
		Process: &specs.Process{Args: []string{"/bin/sh"}, Capabilities: &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps}},
		Mounts: []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "/dev/otel-grpc.sock", Type: "bind", Source: "/x/otel.sock"}},
		Linux:  &specs.Linux{CgroupsPath: cgroupsPath},
	}
}

// TestRuncWrapperConfinesBuildSteps runs the wrapper that containerd's shims run
// as runc, with the arguments the shims give, over a build step's spec and an
// app's: the step's is confined, the app's is left as it was.
func TestRuncWrapperConfinesBuildSteps(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real-runc")
	if err := os.WriteFile(real, []byte(fakeRunc), 0o755); err != nil {
		t.Fatal(err)
	}
	c := Containerd{Dir: filepath.Join(dir, "containerd"), Runc: real, TenantOOMScoreAdj: 500, StepPids: 1234, BuildCgroup: "bex-builds-0123abcd"}
	if _, err := c.WriteConfig(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.RemoveState)
	wrapper := filepath.Join(c.Dir, "bin", "runc")
	record := filepath.Join(dir, "args")
	run := func(env []string, args ...string) {
		t.Helper()
		cmd := exec.Command(wrapper, args...)
		cmd.Env = append(os.Environ(), append(env, "RECORD="+record)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("wrapper %v: %v\n%s", args, err, out)
		}
		got, _ := os.ReadFile(record)
		if want := strings.Join(args, "\n") + "\n"; string(got) != want {
			t.Fatalf("real runc got %q, want %q", got, want)
		}
	}
	shimArgs := func(cmd string, rest ...string) []string {
		return append([]string{"--root", "/run/containerd/runc/bex", "--log", "/x/log.json", "--log-format", "json", cmd}, rest...)
	}

	// A step under the build cgroup, one under the root's (an LLB exec may name
	// its cgroup parent), and one under a path of its choosing.
	for _, cg := range []string{"/bex-builds-0123abcd/buildkit/q1w2e3", "/buildkit/q1w2e3", "x.slice:q1w2e3", "",
		"/bex-builds-0123abcd/../x.slice:q1w2e3", "/bex-builds-0123abcd/buildkit/.."} {
		bundle := t.TempDir()
		config := writeSpec(t, bundle, buildStepSpec(cg))
		run(nil, shimArgs("create", "--bundle", bundle, "--pid-file", "/x/init.pid", "q1w2e3")...)
		s := readSpec(t, config)
		caps := s.Process.Capabilities
		for _, set := range [][]string{caps.Bounding, caps.Effective, caps.Permitted} {
			if slices.Contains(set, "CAP_NET_RAW") || slices.Contains(set, "CAP_MKNOD") || !slices.Contains(set, "CAP_CHOWN") {
				t.Errorf("%s: capabilities %v", cg, set)
			}
		}
		if !s.Process.NoNewPrivileges {
			t.Errorf("%s: no_new_privs not set", cg)
		}
		if s.Linux.Resources == nil || s.Linux.Resources.Pids == nil || s.Linux.Resources.Pids.Limit == nil || *s.Linux.Resources.Pids.Limit != 1234 {
			t.Errorf("%s: pids %+v", cg, s.Linux.Resources)
		}
		for _, m := range s.Mounts {
			if m.Destination == "/dev/otel-grpc.sock" {
				t.Errorf("%s: the OTel socket is still mounted", cg)
			}
		}
		if len(s.Mounts) != 1 {
			t.Errorf("%s: mounts %v", cg, s.Mounts)
		}
		// Below the build cgroup: kept where buildkitd put it, else moved there.
		want := "/bex-builds-0123abcd/buildkit/q1w2e3"
		if s.Linux.CgroupsPath != want {
			t.Errorf("%s: cgroup path %q, want %q", cg, s.Linux.CgroupsPath, want)
		}

		// A process started in the running step (runc exec --process FILE).
		proc := filepath.Join(t.TempDir(), "process.json")
		data, _ := json.Marshal(buildStepSpec("").Process)
		os.WriteFile(proc, data, 0o600)
		run([]string{"STATE_BUNDLE=" + bundle}, shimArgs("exec", "--detach", "--process", proc, "--pid-file", "/x/exec.pid", "q1w2e3")...)
		var p specs.Process
		data, _ = os.ReadFile(proc)
		if err := json.Unmarshal(data, &p); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(p.Capabilities.Effective, "CAP_NET_RAW") || slices.Contains(p.Capabilities.Bounding, "CAP_MKNOD") || !p.NoNewPrivileges {
			t.Errorf("%s: exec'd process not confined: %+v", cg, p)
		}
	}

	// Control: an app's container (a user namespace, another cgroup path) and
	// its exec'd processes are passed on untouched.
	bundle := t.TempDir()
	app := buildStepSpec("/bex/web-1")
	app.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.UserNamespace}}
	app.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1 << 30, Size: 65536}}
	config := writeSpec(t, bundle, app)
	before, _ := os.ReadFile(config)
	run(nil, shimArgs("create", "--bundle", bundle, "web-1")...)
	proc := filepath.Join(t.TempDir(), "process.json")
	data, _ := json.Marshal(buildStepSpec("").Process)
	os.WriteFile(proc, data, 0o600)
	run([]string{"STATE_BUNDLE=" + bundle}, shimArgs("exec", "--process", proc, "web-1")...)
	after, _ := os.ReadFile(config)
	procAfter, _ := os.ReadFile(proc)
	if string(before) != string(after) || string(procAfter) != string(data) {
		t.Fatalf("an app's spec was changed:\n%s\n%s", after, procAfter)
	}
	// Other commands pass through as they are.
	run(nil, "--root", "/run/x", "delete", "--force", "web-1")

	// A step's spec the wrapper cannot read is refused, not run unconfined.
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "config.json"), []byte(`{"linux": {"cgroupsPath": "/bex-builds-0123abcd/buildkit/x"`), 0o600)
	cmd := exec.Command(wrapper, shimArgs("create", "--bundle", bad, "x")...)
	cmd.Env = append(os.Environ(), "RECORD="+record)
	os.Remove(record)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "cannot read") {
		t.Fatalf("unreadable spec: %v\n%s", err, out)
	}
	if _, err := os.Stat(record); err == nil {
		t.Fatal("runc ran on a spec the wrapper could not read")
	}
}

// BenchmarkRuncWrapper measures what the wrapper adds to one `runc create`: of a
// build step (grep and one jq), of an app's container (grep only), beside the
// same runc stand-in run directly, in the same run.
func BenchmarkRuncWrapper(b *testing.B) {
	dir := b.TempDir()
	real := filepath.Join(dir, "real-runc")
	if err := os.WriteFile(real, []byte(fakeRunc), 0o755); err != nil {
		b.Fatal(err)
	}
	c := Containerd{Dir: filepath.Join(dir, "containerd"), Runc: real, StepPids: 2048}
	if _, err := c.WriteConfig(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.RemoveState)
	wrapper := filepath.Join(c.Dir, "bin", "runc")
	env := append(os.Environ(), "RECORD="+filepath.Join(dir, "args"))
	run := func(bin, bundle string) time.Duration {
		cmd := exec.Command(bin, "--root", "/run/x", "create", "--bundle", bundle, "id")
		cmd.Env = env
		began := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		return time.Since(began)
	}
	var direct, step, app time.Duration
	for b.Loop() {
		sb, ab := b.TempDir(), b.TempDir()
		writeSpecB(b, sb, buildStepSpec("/bex-builds-0123abcd/buildkit/x"))
		appSpec := buildStepSpec("/bex/web-1")
		appSpec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.UserNamespace}}
		writeSpecB(b, ab, appSpec)
		direct += run(real, ab)
		step += run(wrapper, sb)
		app += run(wrapper, ab)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(direct), "direct-ms")
	b.ReportMetric(ms(step), "step-ms")
	b.ReportMetric(ms(app), "app-ms")
}

func writeSpecB(b *testing.B, dir string, s specs.Spec) {
	data, err := json.Marshal(s)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		b.Fatal(err)
	}
}
