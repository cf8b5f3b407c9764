package infra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"bex.co/bex/internal/clusterapi"
	"bex.co/bex/internal/testenv"
)

// The in-memory Cluster API test runs in a network namespace of its own, with only
// a loopback device: the in-memory provider's servers (a debug port, and a fake API
// server per workload cluster from port 20000 up) listen on every address, which
// there means loopback only, and they cannot collide with anything else on the
// machine. The test binary re-runs itself there; these variables tell the run
// inside that it is inside, and where the release's sources are (the module cache
// is read outside: no network inside).
const (
	capiNetnsEnv   = "BEX_TEST_CAPI_NETNS"
	capiCoreDirEnv = "BEX_TEST_CAPI_CORE_DIR"
	capiTestDirEnv = "BEX_TEST_CAPI_TEST_DIR"
)

// TestClusterAPIInMemory runs Cluster API for real: the core, kubeadm bootstrap and
// kubeadm control plane controllers and the in-memory infrastructure provider, all
// of one release (hack/versions.env CLUSTER_API_VERSION, built by hack/tools.sh),
// as processes against a real kube-apiserver with that release's CRDs and
// webhooks. infra/clusterapi/base with the in-memory overlay
// (testdata/clusterapi-inmemory) must reconcile to an Available Cluster with its
// Machines Running; scaling the MachineDeployment 1 → 3 → 1 and a
// KubeadmControlPlane rollout must complete; kubectl get machines names each
// machine.
func TestClusterAPIInMemory(t *testing.T) {
	if os.Getenv(capiNetnsEnv) == "" {
		reexecInNetns(t)
		return
	}
	runClusterAPIInMemory(t)
}

// reexecInNetns runs this test again in a new network namespace (unshare --net)
// with its loopback device up, and reports what it printed.
func reexecInNetns(t *testing.T) {
	v := versions(t)["CLUSTER_API_VERSION"]
	if v == "" {
		t.Fatal("hack/versions.env names no CLUSTER_API_VERSION")
	}
	release, err := clusterapi.DownloadRelease(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range clusterapi.Managers() {
		if _, err := testenv.Binary(m.Name); err != nil {
			t.Fatalf("%v (hack/tools.sh builds the Cluster API %s managers)", err, v)
		}
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal("unshare (util-linux) is missing: it gives the test its own network namespace")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal("ip (iproute2) is missing: it brings up the network namespace's loopback device")
	}
	timeout := 10 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = time.Until(d) - 10*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// kube-apiserver needs a default route to pick the address it advertises:
	// the loopback device carries one, with an address of TEST-NET-1 (RFC 5737),
	// so that nothing leaves loopback.
	setup := fmt.Sprintf(`%[1]s link set lo up && %[1]s addr add 192.0.2.1/32 dev lo && %[1]s route add default dev lo && exec "$0" "$@"`, ip)
	cmd := exec.CommandContext(ctx, unshare, "--net", "--", "/bin/sh", "-c", setup,
		os.Args[0], "-test.run=^TestClusterAPIInMemory$", "-test.v", "-test.count=1", fmt.Sprintf("-test.timeout=%s", timeout))
	cmd.Env = append(os.Environ(), capiNetnsEnv+"=1", capiCoreDirEnv+"="+release.CoreDir, capiTestDirEnv+"="+release.TestDir)
	// The run inside dies with this process (a timeout, ^C): unshare execs the
	// shell, which execs the test binary, all under this one PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		t.Log("| " + line)
	}
	if err != nil {
		t.Fatalf("the run in its own network namespace failed: %v", err)
	}
}

func runClusterAPIInMemory(t *testing.T) {
	began := time.Now()
	step := time.Now()
	lap := func(what string) {
		t.Logf("%-45s %6.1f s (%.1f s since the start)", what, time.Since(step).Seconds(), time.Since(began).Seconds())
		step = time.Now()
	}
	release := clusterapi.Release{Version: versions(t)["CLUSTER_API_VERSION"], CoreDir: os.Getenv(capiCoreDirEnv), TestDir: os.Getenv(capiTestDirEnv)}
	dir := t.TempDir()

	cp, err := testenv.StartControlPlane(filepath.Join(dir, "controlplane"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	lap("kube-apiserver and etcd")

	caPEM, certDir, err := clusterapi.WebhookServingCert(dir, "bex test webhook CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kubectlBin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, m := range clusterapi.Managers() {
		mc, err := release.CRDs(kubectlBin, m, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		crds = append(crds, mc...)
	}
	if _, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{CRDs: crds, MaxTime: time.Minute}); err != nil {
		t.Fatalf("install the Cluster API CRDs: %v", err)
	}
	for _, m := range clusterapi.Managers() {
		whs, err := release.Webhooks(m, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		for _, wh := range whs {
			if err := cp.Client.Create(ctx, wh); err != nil {
				t.Fatalf("create %s %s: %v", wh.GetKind(), wh.GetName(), err)
			}
		}
	}
	lap(fmt.Sprintf("%d CRDs and the webhook configurations", len(crds)))

	for _, m := range clusterapi.Managers() {
		startManager(t, dir, cp.Kubeconfig, certDir, m, release.Version)
	}
	lap("the four managers ready")

	ns := cp.Namespace(t, "capi-inmemory")
	const name = "bex-inmemory"
	vars := map[string]string{
		"CLUSTER_NAME":                name,
		"KUBERNETES_VERSION":          "v1.35.0",
		"CONTROL_PLANE_MACHINE_COUNT": "1",
		"WORKER_MACHINE_COUNT":        "1",
		"REGISTRY_NODE_PASSWORD":      "0123456789abcdef0123456789abcdef",
	}
	rendered := manifests(t, overlay{dir: "testdata/clusterapi-inmemory", vars: vars})
	if _, err := kubectl(t, rendered, "--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "--field-manager=bex-infra-test", "-n", ns, "-f", "-"); err != nil {
		t.Fatal(err)
	}
	w := &capiWatcher{t: t, c: cp.Client, ns: ns, cluster: name}
	w.wait("the Cluster Available with 1 control plane and 1 worker machine Running", func() error {
		return errors.Join(w.clusterAvailable(), w.machinesRunning(1, 1, nil))
	})
	lap("Cluster Available, machines Running")
	// The base's MachineHealthChecks watch every machine: the workers' and the
	// control plane's, each found healthy.
	w.wait("the MachineHealthChecks see every machine healthy", func() error {
		return errors.Join(w.machinesHealthy(name+"-md-0", 1), w.machinesHealthy(name+"-control-plane", 1))
	})
	lap("MachineHealthChecks healthy")

	// The managers' webhooks are the ones in force: KubeadmControlPlane's
	// validation refuses what its schema cannot express (an even number of
	// stacked etcd members), and reading an object in the older API version goes
	// through the conversion webhook.
	_, err = kubectl(t, nil, "--kubeconfig", cp.Kubeconfig, "-n", ns, "patch", "kubeadmcontrolplane", name+"-control-plane", "--type=merge",
		"-p", `{"spec":{"replicas":2}}`, "--dry-run=server")
	if err == nil || !strings.Contains(err.Error(), "cannot be an even number when etcd is stacked") {
		t.Fatalf("the KubeadmControlPlane webhook did not refuse 2 replicas: %v", err)
	}
	out, err := kubectl(t, nil, "--kubeconfig", cp.Kubeconfig, "-n", ns, "get", "kubeadmcontrolplanes.v1beta1.controlplane.cluster.x-k8s.io", name+"-control-plane",
		"-o", "jsonpath={.apiVersion} {.spec.replicas}")
	if err != nil || string(out) != "controlplane.cluster.x-k8s.io/v1beta1 1" {
		t.Fatalf("the KubeadmControlPlane read as v1beta1: %q, %v", out, err)
	}

	for _, replicas := range []int64{3, 1} {
		if _, err := kubectl(t, nil, "--kubeconfig", cp.Kubeconfig, "-n", ns, "scale", "machinedeployment", name+"-md-0", fmt.Sprintf("--replicas=%d", replicas)); err != nil {
			t.Fatal(err)
		}
		w.wait(fmt.Sprintf("the MachineDeployment scaled to %d", replicas), func() error {
			return errors.Join(w.machineDeploymentAt(name+"-md-0", replicas), w.machinesRunning(1, int(replicas), nil), w.clusterAvailable())
		})
		lap(fmt.Sprintf("MachineDeployment scaled to %d", replicas))
	}

	// A rollout of the control plane, as `clusterctl alpha rollout restart` starts
	// one: every machine older than spec.rollout.after is replaced.
	old := w.controlPlaneMachines()
	after := time.Now().UTC().Add(time.Second).Format(time.RFC3339)
	if _, err := kubectl(t, nil, "--kubeconfig", cp.Kubeconfig, "-n", ns, "patch", "kubeadmcontrolplane", name+"-control-plane", "--type=merge",
		"-p", fmt.Sprintf(`{"spec":{"rollout":{"after":%q}}}`, after)); err != nil {
		t.Fatal(err)
	}
	w.wait("the KubeadmControlPlane rolled out", func() error {
		return errors.Join(w.controlPlaneRolledOut(name+"-control-plane", 1), w.machinesRunning(1, 1, old), w.clusterAvailable())
	})
	if now := w.controlPlaneMachines(); slices.Equal(now, old) {
		t.Fatalf("the control plane machines are still %v after the rollout", old)
	}
	lap("KubeadmControlPlane rolled out")

	// kubectl get machines names each machine, with its phase.
	out, err = kubectl(t, nil, "--kubeconfig", cp.Kubeconfig, "-n", ns, "get", "machines")
	if err != nil {
		t.Fatal(err)
	}
	listed := tableColumns(t, out, "NAME", "PHASE")
	var want, got []string
	for _, m := range w.machines() {
		want = append(want, m.GetName()+" Running")
	}
	for _, row := range listed {
		got = append(got, row[0]+" "+row[1])
	}
	sort.Strings(want)
	sort.Strings(got)
	if len(want) != 2 || !slices.Equal(got, want) {
		t.Fatalf("kubectl get machines lists %v, want %v (1 control plane, 1 worker):\n%s", got, want, out)
	}
	t.Logf("kubectl get machines:\n%s", out)
}

// startManager starts m's binary against the API server (clusterapi.StartManager:
// ready, and of the release), its log in dir. It is stopped when the test ends:
// SIGTERM, then SIGKILL if it has not exited in 10 s.
func startManager(t *testing.T, dir, kubeconfig, certDir string, m clusterapi.Manager, release string) {
	t.Helper()
	bin, err := testenv.Binary(m.Name)
	if err != nil {
		t.Fatal(err)
	}
	p, err := clusterapi.StartManager(m, clusterapi.Run{
		Bin: bin, Kubeconfig: kubeconfig, CertDir: certDir, LogPath: filepath.Join(dir, m.Name+".log"), Release: release,
		// POD_IP: the address the in-memory provider gives its workload clusters'
		// API servers (their control plane endpoint).
		Env: []string{"POD_IP=127.0.0.1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.Stop(10 * time.Second) {
			t.Errorf("%s (PID %d) ignored SIGTERM for 10 s and was killed", m.Name, p.PID)
		}
		if t.Failed() {
			t.Logf("%s logged these errors last:\n%s", m.Name, logErrors(p.LogPath, 15))
		}
	})
}

// logErrors returns the last n errors (klog's E lines) of the log at path.
func logErrors(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "E") {
			lines = append(lines, l)
		}
	}
	return lastLines(lines, n)
}

func lastLines(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// tableColumns reads kubectl's table output and returns, for each row, the values
// of the named columns.
func tableColumns(t *testing.T, out []byte, names ...string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) == 0 {
		t.Fatal("kubectl printed nothing")
	}
	header := lines[0]
	var starts []int
	for _, n := range names {
		i := strings.Index(header, n)
		if i < 0 || (i > 0 && header[i-1] != ' ') {
			t.Fatalf("kubectl's table has no column %s:\n%s", n, out)
		}
		starts = append(starts, i)
	}
	var rows [][]string
	for _, l := range lines[1:] {
		var row []string
		for _, s := range starts {
			if s >= len(l) {
				row = append(row, "")
				continue
			}
			f := strings.Fields(l[s:])
			if len(f) == 0 {
				row = append(row, "")
				continue
			}
			row = append(row, f[0])
		}
		rows = append(rows, row)
	}
	return rows
}

var (
	clusterGVK  = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	mhcGVK      = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineHealthCheck"}
	machineGVK  = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineList"}
	mdGVK       = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"}
	kcpGVK      = schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"}
	cpLabel     = "cluster.x-k8s.io/control-plane"
	mdNameLabel = "cluster.x-k8s.io/deployment-name"
)

// capiWatcher reads the Cluster API objects of one cluster and says how far they
// are from a state the test waits for.
type capiWatcher struct {
	t       *testing.T
	c       client.Client
	ns      string
	cluster string
}

// capiStepTimeout bounds each wait of the test.
const capiStepTimeout = 3 * time.Minute

// wait polls cond until it returns nil; after capiStepTimeout it fails with cond's
// last answer.
func (w *capiWatcher) wait(what string, cond func() error) {
	w.t.Helper()
	deadline := time.Now().Add(capiStepTimeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not after %s: %v\nmachines: %s", what, capiStepTimeout, err, w.describeMachines())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *capiWatcher) get(gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	err := w.c.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: name}, obj)
	return obj, err
}

func (w *capiWatcher) machines() []unstructured.Unstructured {
	w.t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(machineGVK)
	if err := w.c.List(context.Background(), list, client.InNamespace(w.ns), client.MatchingLabels{"cluster.x-k8s.io/cluster-name": w.cluster}); err != nil {
		w.t.Fatalf("list machines: %v", err)
	}
	return list.Items
}

func (w *capiWatcher) describeMachines() string {
	var out []string
	for _, m := range w.machines() {
		phase, _, _ := unstructured.NestedString(m.Object, "status", "phase")
		out = append(out, fmt.Sprintf("%s=%s", m.GetName(), phase))
	}
	return strings.Join(out, " ")
}

// condition is the status of the condition typ in obj's status.conditions.
func condition(obj *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		c := c.(map[string]any)
		if c["type"] == typ {
			s, _ := c["status"].(string)
			r, _ := c["reason"].(string)
			m, _ := c["message"].(string)
			return s, r, m
		}
	}
	return "", "", ""
}

func (w *capiWatcher) clusterAvailable() error {
	c, err := w.get(clusterGVK, w.cluster)
	if err != nil {
		return err
	}
	if s, r, m := condition(c, "Available"); s != "True" {
		return fmt.Errorf("Cluster Available=%q (%s: %s)", s, r, m)
	}
	return nil
}

// machinesHealthy: the MachineHealthCheck mhc expects n machines and finds
// them all healthy.
func (w *capiWatcher) machinesHealthy(mhc string, n int64) error {
	c, err := w.get(mhcGVK, mhc)
	if err != nil {
		return err
	}
	expected, _, _ := unstructured.NestedInt64(c.Object, "status", "expectedMachines")
	healthy, _, _ := unstructured.NestedInt64(c.Object, "status", "currentHealthy")
	if expected != n || healthy != n {
		return fmt.Errorf("MachineHealthCheck %s: %d of %d machines healthy, want %d of %d", mhc, healthy, expected, n, n)
	}
	return nil
}

// controlPlaneMachines are the names of the control plane's machines, sorted.
func (w *capiWatcher) controlPlaneMachines() []string {
	var names []string
	for _, m := range w.machines() {
		if _, ok := m.GetLabels()[cpLabel]; ok {
			names = append(names, m.GetName())
		}
	}
	sort.Strings(names)
	return names
}

// machinesRunning: exactly cp control plane and workers worker machines, none being
// deleted, none of the names in gone, all Running.
func (w *capiWatcher) machinesRunning(cp, workers int, gone []string) error {
	var errs []error
	nCP, nW := 0, 0
	for _, m := range w.machines() {
		if _, ok := m.GetLabels()[cpLabel]; ok {
			nCP++
		} else if m.GetLabels()[mdNameLabel] != "" {
			nW++
		}
		if slices.Contains(gone, m.GetName()) {
			errs = append(errs, fmt.Errorf("machine %s is still there", m.GetName()))
		}
		if m.GetDeletionTimestamp() != nil {
			errs = append(errs, fmt.Errorf("machine %s is being deleted", m.GetName()))
		}
		if phase, _, _ := unstructured.NestedString(m.Object, "status", "phase"); phase != "Running" {
			errs = append(errs, fmt.Errorf("machine %s is %q", m.GetName(), phase))
		}
	}
	if nCP != cp || nW != workers {
		errs = append(errs, fmt.Errorf("%d control plane and %d worker machines, want %d and %d", nCP, nW, cp, workers))
	}
	return errors.Join(errs...)
}

// replicaCounts checks the v1beta2 replica counters of a MachineDeployment's or
// KubeadmControlPlane's status against want.
func replicaCounts(obj *unstructured.Unstructured, want int64) error {
	var errs []error
	if spec, _, _ := unstructured.NestedInt64(obj.Object, "spec", "replicas"); spec != want {
		errs = append(errs, fmt.Errorf("%s spec.replicas %d, want %d", obj.GetKind(), spec, want))
	}
	for _, f := range []string{"replicas", "readyReplicas", "availableReplicas", "upToDateReplicas"} {
		if got, _, _ := unstructured.NestedInt64(obj.Object, "status", f); got != want {
			errs = append(errs, fmt.Errorf("%s status.%s %d, want %d", obj.GetKind(), f, got, want))
		}
	}
	if gen, _, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration"); gen != obj.GetGeneration() {
		errs = append(errs, fmt.Errorf("%s has observed generation %d of %d", obj.GetKind(), gen, obj.GetGeneration()))
	}
	return errors.Join(errs...)
}

func (w *capiWatcher) machineDeploymentAt(name string, replicas int64) error {
	md, err := w.get(mdGVK, name)
	if err != nil {
		return err
	}
	return replicaCounts(md, replicas)
}

func (w *capiWatcher) controlPlaneRolledOut(name string, replicas int64) error {
	kcp, err := w.get(kcpGVK, name)
	if err != nil {
		return err
	}
	err = replicaCounts(kcp, replicas)
	if s, r, m := condition(kcp, "RollingOut"); s != "False" {
		err = errors.Join(err, fmt.Errorf("KubeadmControlPlane RollingOut=%q (%s: %s)", s, r, m))
	}
	return err
}
