package capd

import (
	"fmt"
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

// TestAWorkerIsReplacedAndTheAppKeepsAnswering is the cluster's life in one
// sequence: a push over ssh served over HTTPS by the edge; the MachineDeployment
// scaled 1 → 2, a new container joining as a Ready node; the app at 2 replicas,
// one per worker (the first's cordoned while the second is placed); then one worker's container killed: the MachineHealthCheck has
// its Machine deleted, a new container joins in its place, and the app keeps
// answering through the control plane's edge (the failed requests during the
// loss are counted and logged).
func TestAWorkerIsReplacedAndTheAppKeepsAnswering(t *testing.T) {
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
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := curl(app, "/"); err != nil {
				failed.Add(1)
			} else {
				ok.Add(1)
			}
		}
	}()
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
	close(stop)
	wg.Wait()
	t.Logf("measured: worker %s killed; its replacement Ready after %.0f s; requests during the loss: %d answered, %d failed",
		victim, healed.Seconds(), ok.Load(), failed.Load())
	if ok.Load() == 0 {
		t.Fatal("no request was answered while a worker was lost")
	}
	for i := range 10 {
		if _, err := curl(app, "/"); err != nil {
			t.Fatalf("request %d after the replacement: %v", i, err)
		}
	}
	t.Logf("kubectl get machines:\n%s", mgmt(t, "get", "machines"))
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
