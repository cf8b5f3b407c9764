package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// evenControlPlane is a KubeadmControlPlane that its schema accepts and its
// webhook refuses (2 replicas with stacked etcd); with 3 replicas it is accepted.
const evenControlPlane = `apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: KubeadmControlPlane
metadata:
  name: even
  namespace: default
spec:
  replicas: 2
  version: v1.35.0
  machineTemplate:
    spec:
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: DockerMachineTemplate
        name: even
  kubeadmConfigSpec:
    format: cloud-config
`

const evenRefused = "cannot be an even number when etcd is stacked"

// TestUpDown runs the command as hack/cluster-capd.sh does: up starts the
// management plane, whose API server has Cluster API's CRDs and whose managers
// serve their webhooks; a manager that dies is restarted; up again finds it
// running; down stops it and leaves no process behind.
func TestUpDown(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectlBin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	capdmgmt := filepath.Join(t.TempDir(), "capdmgmt")
	if out, err := exec.Command("go", "build", "-o", capdmgmt, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	mgmt := filepath.Join(dir, "mgmt")
	// A network namespace of the test's own, with only loopback: CAPD's manager
	// listens on port 19000 of every address whatever it is told, so a management
	// plane on the host (infra/capd's cluster, in the same go test run) would
	// collide with this one. kube-apiserver needs a default route to pick the
	// address it advertises: loopback carries one, with an address of TEST-NET-1
	// (RFC 5737), so that nothing leaves it.
	ns := fmt.Sprintf("bex-capdmgmt-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "addr", "add", "192.0.2.1/32", "dev", "lo")
	ip("-n", ns, "route", "add", "default", "dev", "lo")
	inNetns := func(ctx context.Context, name string, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := inNetns(ctx, capdmgmt, append(args, dir)...)
		cmd.Dir = root
		// CAPD's manager becomes ready without Docker (it connects when it has
		// machines to make): the test does not depend on a Docker daemon.
		cmd.Env = append(os.Environ(), "DOCKER_HOST=unix://"+filepath.Join(dir, "no-docker.sock"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Whatever happens, nothing of it outlives the test.
	t.Cleanup(func() {
		if out, err := run("down"); err != nil {
			t.Errorf("capdmgmt down at the end: %v\n%s", err, out)
		}
		for _, p := range processesNaming(dir) {
			t.Errorf("left running: PID %d %s", p.pid, strings.Join(p.args, " "))
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		if t.Failed() {
			data, _ := os.ReadFile(filepath.Join(mgmt, "logs/capdmgmt.log"))
			t.Logf("capdmgmt.log:\n%s", data)
		}
	})
	kubectl := func(stdin string, args ...string) (string, error) {
		t.Helper()
		cmd := inNetns(context.Background(), kubectlBin, append([]string{"--kubeconfig", filepath.Join(mgmt, "kubeconfig")}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	began := time.Now()
	out, err := run("up")
	if err != nil {
		t.Fatalf("capdmgmt up: %v\n%s", err, out)
	}
	t.Logf("up, cold: %.1f s", time.Since(began).Seconds())
	servePID := pidFile(t, mgmt)

	if out, err := kubectl("", "get", "crd", "machines.cluster.x-k8s.io"); err != nil {
		t.Fatalf("kubectl get crd machines.cluster.x-k8s.io: %v\n%s", err, out)
	}
	// KubeadmControlPlane's validation webhook, served by its manager on loopback,
	// refuses what its schema cannot express; the same object with 3 replicas is
	// accepted, so the refusal is the webhook's.
	if out, err := kubectl(evenControlPlane, "apply", "--dry-run=server", "-f", "-"); err == nil || !strings.Contains(out, evenRefused) {
		t.Fatalf("the KubeadmControlPlane webhook did not refuse 2 replicas: %v\n%s", err, out)
	}
	if out, err := kubectl(strings.Replace(evenControlPlane, "replicas: 2", "replicas: 3", 1), "apply", "--dry-run=server", "-f", "-"); err != nil {
		t.Fatalf("a KubeadmControlPlane of 3 replicas is refused: %v\n%s", err, out)
	}

	// A manager that dies is started again, and serves again.
	kcp := managerPID(t, dir, "kubeadm-control-plane-controller")
	if err := syscall.Kill(kcp, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		out, err := kubectl(evenControlPlane, "apply", "--dry-run=server", "-f", "-")
		if err != nil && strings.Contains(out, evenRefused) {
			if again := managerPID(t, dir, "kubeadm-control-plane-controller"); again != kcp {
				break
			}
		}
		if time.Since(killed) > time.Minute {
			t.Fatalf("kubeadm-control-plane-controller killed a minute ago; its webhook answers: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("a killed manager serves again after %.1f s", time.Since(killed).Seconds())

	began = time.Now()
	out, err = run("up")
	if err != nil {
		t.Fatalf("capdmgmt up, again: %v\n%s", err, out)
	}
	t.Logf("up, warm: %.3f s", time.Since(began).Seconds())
	if !strings.Contains(out, fmt.Sprintf("runs (PID %d)", servePID)) || pidFile(t, mgmt) != servePID {
		t.Fatalf("up again did not find PID %d running:\n%s", servePID, out)
	}

	began = time.Now()
	if out, err := run("down"); err != nil {
		t.Fatalf("capdmgmt down: %v\n%s", err, out)
	}
	t.Logf("down: %.1f s", time.Since(began).Seconds())
	if left := processesNaming(dir); len(left) > 0 {
		t.Fatalf("down left %d processes running, the first PID %d: %s", len(left), left[0].pid, strings.Join(left[0].args, " "))
	}
	for _, f := range []string{"pid", "ready"} {
		if _, err := os.Stat(filepath.Join(mgmt, f)); !os.IsNotExist(err) {
			t.Errorf("mgmt/%s is there after down (%v)", f, err)
		}
	}
	if out, err := run("down"); err != nil || !strings.Contains(out, "does not run") {
		t.Fatalf("capdmgmt down, again: %v\n%s", err, out)
	}
}

func pidFile(t *testing.T, mgmt string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mgmt, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// managerPID is the PID of the one process of bin/name whose command line names dir.
func managerPID(t *testing.T, dir, name string) int {
	t.Helper()
	var pids []int
	for _, p := range processesNaming(dir) {
		if filepath.Base(p.args[0]) == name {
			pids = append(pids, p.pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("%d processes of %s for %s, want 1: %v", len(pids), name, dir, pids)
	}
	return pids[0]
}

// processesNaming lists the processes whose command line contains dir.
func processesNaming(dir string) []proc {
	return processes(func(args []string) bool {
		return strings.Contains(strings.Join(args, " "), dir)
	})
}
