package capd

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// machines maps each Machine of the Cluster to its phase.
func machines(t testing.TB) map[string]string {
	t.Helper()
	out := mgmt(t, "get", "machines", "-l", "cluster.x-k8s.io/cluster-name="+env["CLUSTER_NAME"],
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.phase}{"\n"}{end}`)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, phase, ok := strings.Cut(l, " "); ok {
			m[name] = phase
		}
	}
	return m
}

// workers are the worker Machines' names, sorted.
func workers(t testing.TB) []string {
	t.Helper()
	out := mgmt(t, "get", "machines", "-l", "cluster.x-k8s.io/deployment-name="+env["CLUSTER_NAME"]+"-md-0",
		"-o", `jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}`)
	ws := strings.Fields(out)
	sort.Strings(ws)
	return ws
}

// readyNodes are the workload cluster's Ready nodes.
func readyNodes(t testing.TB) []string {
	t.Helper()
	out := kubectl(t, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	var ready []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, status, ok := strings.Cut(l, " "); ok && status == "True" {
			ready = append(ready, name)
		}
	}
	sort.Strings(ready)
	return ready
}

// containers are the names of the running Docker containers of the Cluster.
func containers(t testing.TB) []string {
	t.Helper()
	out := docker(t, "ps", "--filter", "label=io.x-k8s.kind.cluster="+env["CLUSTER_NAME"], "--format", "{{.Names}}")
	cs := strings.Fields(out)
	sort.Strings(cs)
	return cs
}

// allRunning checks that every Machine is Running, is a running container of its
// own name, and is a Ready node.
func allRunning(t testing.TB, want int) error {
	ms := machines(t)
	if len(ms) != want {
		return fmt.Errorf("%d machines, want %d: %v", len(ms), want, ms)
	}
	cs, nodes := containers(t), readyNodes(t)
	for name, phase := range ms {
		if phase != "Running" {
			return fmt.Errorf("machine %s is %s", name, phase)
		}
		if !slices.Contains(cs, name) {
			return fmt.Errorf("machine %s has no running container of its name (containers: %v)", name, cs)
		}
		if !slices.Contains(nodes, name) {
			return fmt.Errorf("machine %s is no Ready node (Ready: %v)", name, nodes)
		}
	}
	return nil
}

// TestMachinesAreContainers: kubectl get machines names a Docker container for
// each machine (and the load balancer's beside them), every Machine is Running,
// and its node Ready.
func TestMachinesAreContainers(t *testing.T) {
	if err := allRunning(t, 2); err != nil {
		t.Fatal(err)
	}
	// The machines booted, their systemd applied its sysctl.d files: the host's
	// kernel settings are what they were (other packages' tests run beside this
	// one on the same kernel).
	if hostSysctls != nil {
		if changed := sysctlsChanged(); changed != "" {
			t.Errorf("the machines changed the host's kernel settings: %s", changed)
		}
	}
	cs := containers(t)
	if !slices.Contains(cs, env["CLUSTER_NAME"]+"-lb") {
		t.Fatalf("no load balancer container %s-lb among %v", env["CLUSTER_NAME"], cs)
	}
	t.Logf("kubectl get machines:\n%s", mgmt(t, "get", "machines"))
	t.Logf("docker ps:\n%s", docker(t, "ps", "--filter", "label=io.x-k8s.kind.cluster="+env["CLUSTER_NAME"],
		"--format", "table {{.Names}}\t{{.Image}}\t{{.Status}}"))
}

// TestWorkersScaleHealAndUpgradeWhileTheAppAnswers is the cluster's life in one
// sequence: a push over ssh served over HTTPS by the edge; the MachineDeployment
// scaled 1 → 2, a new container joining as a Ready node; the app at 2 replicas,
// one per worker (the first's cordoned while the second is placed); one worker's
// container killed: the MachineHealthCheck has its Machine deleted, a new
// container joins in its place; then the cluster (made at the release before
// KUBE_VERSION) upgraded to KUBE_VERSION, the control plane and then the workers,
// one machine at a time. Through the loss and the upgrade the app answers (the
// failed requests are counted and logged).
func TestWorkersScaleHealAndUpgradeWhileTheAppAnswers(t *testing.T) {
	// A name of its own per run: a cluster kept up (BEX_TEST_CAPD_ENV) has the
	// earlier runs' apps.
	app := fmt.Sprintf("capd-hello-%d", time.Now().Unix()%100000)
	pushSample(t, "hello-shell", app)
	testenv.Eventually(t, 2*time.Minute, app+" served over HTTPS", func() error {
		body, err := curl(app, "/")
		if err == nil && !strings.Contains(body, "hello from bex") {
			err = fmt.Errorf("body %q", body)
		}
		return err
	})

	// Scale the workers 1 → 2.
	start := time.Now()
	mgmt(t, "scale", "machinedeployment", env["CLUSTER_NAME"]+"-md-0", "--replicas=2")
	testenv.Eventually(t, 6*time.Minute, "a second worker joins as a Ready node", func() error { return allRunning(t, 3) })
	t.Logf("measured: a new worker Ready %.0f s after the MachineDeployment was scaled to 2", time.Since(start).Seconds())

	// Two replicas, one on each worker. The kube runtime's spread by node is soft
	// (ScheduleAnyway), and a node just Ready may still carry its not-ready taint
	// for a moment: the first replica's worker is cordoned while the second is
	// placed, so that the loss below always takes one replica of two.
	var first string
	testenv.Eventually(t, time.Minute, "the first replica ready", func() error {
		p := readyPodNodes(t, app)
		if len(p) != 1 {
			return fmt.Errorf("ready pods and their nodes: %v", p)
		}
		for _, n := range p {
			first = n
		}
		return nil
	})
	kubectl(t, "cordon", first)
	uncordon := sync.OnceFunc(func() { kubectl(t, "uncordon", first) })
	t.Cleanup(uncordon)
	bex(t, "ps:scale", app, "web=2")
	var pods map[string]string // pod -> node
	testenv.Eventually(t, 3*time.Minute, "2 ready replicas on 2 workers", func() error {
		pods = readyPodNodes(t, app)
		nodes := map[string]bool{}
		for _, n := range pods {
			nodes[n] = true
		}
		if len(pods) != 2 || len(nodes) != 2 {
			return fmt.Errorf("ready pods and their nodes: %v", pods)
		}
		return nil
	})

	uncordon()

	// Kill one worker's container, with requests running through the edge.
	var victim string
	for _, n := range pods {
		victim = n
		break
	}
	requests := startRequests(env["HTTPS_ADDR"], app)
	start = time.Now()
	docker(t, "kill", victim)
	testenv.Eventually(t, 8*time.Minute, "the MachineHealthCheck has "+victim+" replaced by a new Ready worker", func() error {
		if _, there := machines(t)[victim]; there {
			return fmt.Errorf("machine %s is still there", victim)
		}
		return allRunning(t, 3)
	})
	healed := time.Since(start)
	testenv.Eventually(t, 3*time.Minute, "2 ready replicas again", func() error {
		if p := readyPodNodes(t, app); len(p) != 2 {
			return fmt.Errorf("ready pods: %v", p)
		}
		return nil
	})
	ok, failed := requests.stop()
	t.Logf("measured: worker %s killed; its replacement Ready after %.0f s; requests during the loss: %d answered, %d failed",
		victim, healed.Seconds(), ok, failed)
	if ok == 0 {
		t.Fatal("no request was answered while a worker was lost")
	}
	answersTenTimes(t, app, "the replacement")
	t.Logf("kubectl get machines:\n%s", mgmt(t, "get", "machines"))

	upgradeCluster(t, app)
}

// upgradeCluster upgrades the cluster, made at the release before
// (CLUSTER_VERSION=KUBE_PREVIOUS_VERSION), to KUBE_VERSION as a user upgrades a
// Cluster API cluster: the control plane first, then the workers, each with a
// new DevMachineTemplate (the new release's node image) and its version and
// template changed in one patch. Cluster API replaces the machines one by one
// (a new machine first, then an old one drained and deleted); the app's two
// replicas keep answering through an edge whose machine stays (a worker's while
// the control plane's machine is replaced, the new control plane's while the
// workers are), and the failed requests are counted and logged.
func upgradeCluster(t *testing.T, app string) {
	cluster := env["CLUSTER_NAME"]
	kcp := cluster + "-control-plane"
	md := cluster + "-md-0"
	from := strings.TrimSpace(mgmt(t, "get", "kubeadmcontrolplane", kcp, "-o", "jsonpath={.spec.version}"))
	to := upgradeTo
	if from == to {
		t.Fatalf("the cluster runs %s already: nothing to upgrade (hack/cluster-capd.sh up with CLUSTER_VERSION=KUBE_PREVIOUS_VERSION makes one to upgrade)", to)
	}
	if got := kubeletVersions(t, ""); len(got) != 3 || got[0] != from || got[2] != from {
		t.Fatalf("the nodes' kubelets are %v, want 3 of %s", got, from)
	}

	// The control plane's machine, with requests through a worker's edge.
	worker := nodeIP(t, "!node-role.kubernetes.io/control-plane")
	requests := startRequests(net.JoinHostPort(worker, "443"), app)
	start := time.Now()
	newTemplate(t, kcp, from, to)
	mgmt(t, "patch", "kubeadmcontrolplane", kcp, "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"version":%q,"machineTemplate":{"spec":{"infrastructureRef":{"name":%q}}}}}`, to, templateName(kcp, to)))
	cpLeaving := watchRollout(t, start, "cluster.x-k8s.io/control-plane-name="+kcp, from, to, 1, "node-role.kubernetes.io/control-plane")
	cpTook := time.Since(start)
	cpOK, cpFailed := requests.stop()
	t.Logf("measured: the control plane upgraded %s → %s in %.0f s, at most %d old machine leaving at once; requests through a worker's edge: %d answered, %d failed",
		from, to, cpTook.Seconds(), cpLeaving, cpOK, cpFailed)

	// bex's addresses are the control plane machine's: the new one's now (every
	// node serves ssh and https; the old machine is gone).
	cp := nodeIP(t, "node-role.kubernetes.io/control-plane")
	env["SSH_ADDR"], env["HTTPS_ADDR"] = net.JoinHostPort(cp, sshPort()), net.JoinHostPort(cp, "443")
	// Used once its edge serves: an edge on a new machine exits while the API
	// server's Service is not yet routed there (its kube-proxy starting), and the
	// kubelet starts it again a few seconds later.
	testenv.Eventually(t, 2*time.Minute, "the new control plane's edge answers 20 requests in a row", func() error {
		for range 20 {
			if _, err := curl(app, "/"); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	})

	// The workers, with requests through the new control plane's edge.
	requests = startRequests(env["HTTPS_ADDR"], app)
	start = time.Now()
	newTemplate(t, md, from, to)
	mgmt(t, "patch", "machinedeployment", md, "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"template":{"spec":{"version":%q,"infrastructureRef":{"name":%q}}}}}`, to, templateName(md, to)))
	mdLeaving := watchRollout(t, start, "cluster.x-k8s.io/deployment-name="+md, from, to, 2, "!node-role.kubernetes.io/control-plane")
	mdTook := time.Since(start)
	testenv.Eventually(t, 3*time.Minute, "2 ready replicas after the upgrade", func() error {
		if p := readyPodNodes(t, app); len(p) != 2 {
			return fmt.Errorf("ready pods: %v", p)
		}
		return nil
	})
	mdOK, mdFailed := requests.stop()
	t.Logf("measured: the workers upgraded %s → %s in %.0f s, at most %d old machine leaving at once; requests through the control plane's edge: %d answered, %d failed",
		from, to, mdTook.Seconds(), mdLeaving, mdOK, mdFailed)

	if cpLeaving > 1 || mdLeaving > 1 {
		t.Errorf("old machines leaving at once: %d of the control plane's, %d of the workers': the rollout is not one by one", cpLeaving, mdLeaving)
	}
	if cpOK == 0 || mdOK == 0 {
		t.Fatal("no request was answered during an upgrade")
	}
	if err := allRunning(t, 3); err != nil {
		t.Fatal(err)
	}
	if got := kubeletVersions(t, ""); len(got) != 3 || got[0] != to || got[2] != to {
		t.Fatalf("after the upgrade the nodes' kubelets are %v, want 3 of %s", got, to)
	}
	answersTenTimes(t, app, "the upgrade")
	t.Logf("kubectl get machines:\n%s", mgmt(t, "get", "machines"))
}

// templateName names the DevMachineTemplate of release to for the machines of
// owner (a KubeadmControlPlane or a MachineDeployment, whose template is named
// after it).
func templateName(owner, to string) string { return owner + "-" + strings.ReplaceAll(to, ".", "-") }

// newTemplate makes the DevMachineTemplate of release to: owner's (named
// after it), with the node image of release to.
func newTemplate(t *testing.T, owner, from, to string) {
	t.Helper()
	var tmpl struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Spec       map[string]any `json:"spec"`
	}
	if err := json.Unmarshal([]byte(mgmt(t, "get", "devmachinetemplate", owner, "-o", "json")), &tmpl); err != nil {
		t.Fatal(err)
	}
	backend, _ := tmpl.Spec["template"].(map[string]any)["spec"].(map[string]any)["backend"].(map[string]any)["docker"].(map[string]any)
	image, _ := backend["customImage"].(string)
	if !strings.HasSuffix(image, ":"+from) {
		t.Fatalf("the DevMachineTemplate %s has image %q, not one of %s", owner, image, from)
	}
	backend["customImage"] = strings.TrimSuffix(image, from) + to
	manifest, err := json.Marshal(map[string]any{"apiVersion": tmpl.APIVersion, "kind": tmpl.Kind,
		"metadata": map[string]any{"name": templateName(owner, to), "namespace": "default"}, "spec": tmpl.Spec})
	if err != nil {
		t.Fatal(err)
	}
	mgmtStdin(t, manifest, "apply", "-f", "-")
}

// watchRollout waits until the machines of selector are want machines of
// release to, Running, whose Ready nodes (of nodeSelector) run a kubelet of to,
// logging each machine's changes; it returns the most machines of release from
// that were leaving (deleting) at once.
func watchRollout(t *testing.T, start time.Time, selector, from, to string, want int, nodeSelector string) int {
	t.Helper()
	maxLeaving, seen := 0, map[string]string{}
	testenv.Eventually(t, 12*time.Minute, fmt.Sprintf("%d machines of %s (%s) Running and Ready", want, to, selector), func() error {
		out := mgmt(t, "get", "machines", "-l", selector,
			"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.version} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}`)
		leaving, current, all := 0, 0, 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 3 {
				continue
			}
			all++
			deleting := len(f) > 3 || f[2] == "Deleting"
			state := f[1] + " " + f[2]
			if deleting {
				state += " (deleting)"
			}
			if seen[f[0]] != state {
				t.Logf("%4.0f s: machine %s %s", time.Since(start).Seconds(), f[0], state)
				seen[f[0]] = state
			}
			if f[1] == from && deleting {
				leaving++
			}
			if f[1] == to && f[2] == "Running" && !deleting {
				current++
			}
		}
		maxLeaving = max(maxLeaving, leaving)
		got := kubeletVersions(t, nodeSelector)
		if current != want || all != want || len(got) != want || got[0] != to || got[want-1] != to {
			return fmt.Errorf("%d of %d machines of %s Running; the Ready nodes' kubelets: %v", current, all, to, got)
		}
		return nil
	})
	return maxLeaving
}

// kubeletVersions are the Ready nodes' (of selector, or all) kubelet versions,
// sorted.
func kubeletVersions(t testing.TB, selector string) []string {
	t.Helper()
	args := []string{"get", "nodes"}
	if selector != "" {
		args = append(args, "-l", selector)
	}
	out := kubectl(t, append(args, "-o", `jsonpath={range .items[*]}{.status.nodeInfo.kubeletVersion} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)...)
	var vs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if v, status, ok := strings.Cut(l, " "); ok && status == "True" {
			vs = append(vs, v)
		}
	}
	sort.Strings(vs)
	return vs
}

// nodeIP is the address of the first node of selector.
func nodeIP(t testing.TB, selector string) string {
	t.Helper()
	ip := strings.TrimSpace(kubectl(t, "get", "nodes", "-l", selector,
		"-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	if ip == "" {
		t.Fatalf("no node of %s has an address", selector)
	}
	return ip
}

// sshPort is the port of SSH_ADDR (the gitserver's node port, on every node).
func sshPort() string {
	_, p, _ := net.SplitHostPort(env["SSH_ADDR"])
	return p
}

// answersTenTimes checks that the app answers 10 requests of 10 after what.
func answersTenTimes(t *testing.T, app, after string) {
	t.Helper()
	for i := range 10 {
		if _, err := curl(app, "/"); err != nil {
			t.Fatalf("request %d after %s: %v", i, after, err)
		}
	}
}

// requests is a GET through the edge at addr every 100 ms, counted until stop.
type requests struct {
	ok, failed atomic.Int64
	done       chan struct{}
	wg         sync.WaitGroup
}

func startRequests(addr, app string) *requests {
	r := &requests{done: make(chan struct{})}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case <-r.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := curlAt(addr, app, "/"); err != nil {
				r.failed.Add(1)
			} else {
				r.ok.Add(1)
			}
		}
	}()
	return r
}

// stop ends the requests and says how many were answered and how many failed.
func (r *requests) stop() (ok, failed int64) {
	close(r.done)
	r.wg.Wait()
	return r.ok.Load(), r.failed.Load()
}

// readyPodNodes maps the app's ready web pods to their nodes.
func readyPodNodes(t testing.TB, app string) map[string]string {
	t.Helper()
	out := kubectl(t, "get", "pods", "-A", "-l", "app.bex.co/app="+app,
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[2] == "True" {
			m[f[0]] = f[1]
		}
	}
	return m
}
