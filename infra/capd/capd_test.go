package capd

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// env is the cluster's cluster.env, read by TestMain.
var env map[string]string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The cluster is made at the release before KUBE_VERSION, which
	// TestWorkersScaleHealAndUpgradeWhileTheAppAnswers upgrades it to.
	previous, err := versionsEnv(root, "KUBE_PREVIOUS_VERSION")
	if err == nil {
		upgradeTo, err = versionsEnv(root, "KUBE_VERSION")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if f := os.Getenv("BEX_TEST_CAPD_ENV"); f != "" {
		var err error
		if env, err = readEnv(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}
	dir, err := os.MkdirTemp("/tmp", "bex-capd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	script := filepath.Join(root, "hack", "cluster-capd.sh")
	dockerBefore, bridgesBefore := dockerRuns(), bridges()
	hostSysctls = sysctls()
	down := func() int {
		start := time.Now()
		out, err := exec.Command(script, "down", dir).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "hack/cluster-capd.sh down %s: %v\n%s", dir, err, out)
			return 1
		}
		fmt.Fprintf(os.Stderr, "cluster down in %.0f s\n", time.Since(start).Seconds())
		if changed := sysctlsChanged(); changed != "" {
			fmt.Fprintf(os.Stderr, "the host's kernel settings changed: %s\n", changed)
			return 1
		}
		if left := leftovers(dir, dockerBefore, bridgesBefore); left != "" {
			fmt.Fprintf(os.Stderr, "hack/cluster-capd.sh down %s left %s\n", dir, left)
			return 1
		}
		_ = os.RemoveAll(dir)
		return 0
	}
	start := time.Now()
	cmd := exec.Command(script, "up", dir)
	cmd.Env = append(os.Environ(), "CLUSTER_NAME="+clusterName, "WORKERS=1", "CLUSTER_VERSION="+previous)
	out, err := cmd.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hack/cluster-capd.sh up %s: %v\n%s\n", dir, err, out)
		dumpLogs(dir)
		down()
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster up in %.0f s\n", time.Since(start).Seconds())
	if env, err = readEnv(filepath.Join(dir, "cluster.env")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		down()
		return 1
	}
	code := m.Run()
	if code != 0 {
		dumpLogs(dir)
	}
	if down() != 0 {
		return 1
	}
	return code
}

// upgradeTo is KUBE_VERSION, the release the cluster is upgraded to.
var upgradeTo string

// versionsEnv is the value of KEY in hack/versions.env.
func versionsEnv(root, key string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "hack", "versions.env"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("hack/versions.env has no %s=", key)
}

// clusterName names the test's Cluster, and so its containers (CLUSTER_NAME-lb,
// and one per Machine, named after it).
const clusterName = "bex-capd"

// dockerRuns says whether a Docker daemon answers.
func dockerRuns() bool { return exec.Command("docker", "info").Run() == nil }

// hostKernelSettings are global kernel settings (not a network namespace's) that
// a machine's boot would set if its image let it (procps' and systemd's
// sysctl.d files): a privileged container can write them. The kubelet's own
// (vm.overcommit_memory, kernel.panic, ...) are not among them: a kubelet sets
// them wherever it runs, the one-node cluster's too (docs/cluster.md).
var hostKernelSettings = []string{"fs/protected_regular", "fs/protected_fifos", "fs/protected_symlinks",
	"fs/protected_hardlinks", "kernel/pid_max", "kernel/core_uses_pid"}

// hostSysctls are their values before up.
var hostSysctls map[string]string

func sysctls() map[string]string {
	m := map[string]string{}
	for _, k := range hostKernelSettings {
		b, _ := os.ReadFile("/proc/sys/" + k)
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// sysctlsChanged names the settings whose values are not those of before up.
func sysctlsChanged() string {
	var changed []string
	for k, v := range sysctls() {
		if hostSysctls[k] != v {
			changed = append(changed, fmt.Sprintf("%s %s → %s", k, hostSysctls[k], v))
		}
	}
	return strings.Join(changed, ", ")
}

// bridges are the machine's bridge devices made by Docker (br-<network id>).
func bridges() map[string]bool {
	devs, _ := filepath.Glob("/sys/class/net/br-*")
	m := map[string]bool{}
	for _, d := range devs {
		m[filepath.Base(d)] = true
	}
	return m
}

// leftovers names what down left of the cluster in dir: its containers (also
// when down stopped Docker: a container Docker keeps comes back with it), the
// Docker network's bridge, Docker itself when it was not running before, and any
// process or mount under dir.
func leftovers(dir string, dockerBefore bool, bridgesBefore map[string]bool) string {
	var left []string
	if dockerRuns() {
		if !dockerBefore {
			left = append(left, "Docker running")
		}
		out, _ := exec.Command("docker", "ps", "-a", "--filter", "label=io.x-k8s.kind.cluster="+clusterName, "--format", "{{.Names}}").Output()
		if s := strings.TrimSpace(string(out)); s != "" {
			left = append(left, "containers "+strings.ReplaceAll(s, "\n", " "))
		}
	} else {
		// Docker's own record of its containers (Debian's data root).
		configs, _ := filepath.Glob("/var/lib/docker/containers/*/config.v2.json")
		for _, c := range configs {
			if b, err := os.ReadFile(c); err == nil && bytes.Contains(b, []byte(`"io.x-k8s.kind.cluster":"`+clusterName+`"`)) {
				left = append(left, "the container "+filepath.Base(filepath.Dir(c))+" in Docker's state")
			}
		}
	}
	for b := range bridges() {
		if !bridgesBefore[b] {
			left = append(left, "the bridge "+b)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			left = append(left, "process "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, dir) {
			left = append(left, "mount "+l)
		}
	}
	return strings.Join(left, "; ")
}

// dumpLogs prints the end of the management plane's logs and the cluster's pods,
// for a failed run.
func dumpLogs(dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "mgmt", "logs", "*.log"))
	for _, l := range logs {
		out, _ := exec.Command("tail", "-n", "15", l).Output()
		fmt.Fprintf(os.Stderr, "--- %s\n%s", l, out)
	}
	if k, err := testenv.Binary("kubectl"); err == nil {
		out, _ := exec.Command(k, "--kubeconfig", filepath.Join(dir, "mgmt", "kubeconfig"), "get", "machines", "-A").CombinedOutput()
		fmt.Fprintf(os.Stderr, "--- machines\n%s", out)
		out, _ = exec.Command(k, "--kubeconfig", filepath.Join(dir, "kubeconfig"), "get", "nodes,pods", "-A", "-o", "wide").CombinedOutput()
		fmt.Fprintf(os.Stderr, "--- nodes and pods\n%s", out)
	}
}

func readEnv(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	e := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok {
			e[k] = v
		}
	}
	for _, k := range []string{"KUBECONFIG", "MGMT_KUBECONFIG", "CLUSTER_NAME", "SSH_ADDR", "HTTPS_ADDR", "BASE_DOMAIN", "CA_FILE", "ADMIN_IDENTITY"} {
		if e[k] == "" {
			return nil, fmt.Errorf("%s has no %s= line", path, k)
		}
	}
	return e, nil
}

// kubectl runs the real kubectl against the workload cluster; mgmt against the
// management plane, in the namespace of the Cluster's objects.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	return kubectlWith(t, env["KUBECONFIG"], args...)
}

func mgmt(t testing.TB, args ...string) string {
	t.Helper()
	return kubectlWith(t, env["MGMT_KUBECONFIG"], append([]string{"-n", "default"}, args...)...)
}

// mgmtStdin is mgmt with stdin.
func mgmtStdin(t testing.TB, stdin []byte, args ...string) string {
	t.Helper()
	return kubectlStdin(t, env["MGMT_KUBECONFIG"], stdin, append([]string{"-n", "default"}, args...)...)
}

func kubectlWith(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	return kubectlStdin(t, kubeconfig, nil, args...)
}

func kubectlStdin(t testing.TB, kubeconfig string, stdin []byte, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// docker runs the real docker CLI.
func docker(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sshCommand is the ssh a user runs, with the admin's key.
func sshCommand() string {
	return "ssh -F /dev/null -i " + env["ADMIN_IDENTITY"] + " -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes"
}

// bex runs a bex command over ssh as the admin.
func bex(t testing.TB, args ...string) string {
	t.Helper()
	out, err := bexTry(args...)
	if err != nil {
		t.Fatalf("ssh bex %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// bexTry is bex that returns the command's failure.
func bexTry(args ...string) (string, error) {
	h, p, _ := net.SplitHostPort(env["SSH_ADDR"])
	fields := strings.Fields(sshCommand())
	out, err := exec.Command(fields[0], append(append(fields[1:], "-p", p, "git@"+h), args...)...).CombinedOutput()
	return string(out), err
}

// pushSample pushes hack/samples/SAMPLE as app APP with the real git over ssh.
func pushSample(t testing.TB, sample, app string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(root, "hack", "samples", sample)+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("cp %s: %v\n%s", sample, err, out)
	}
	return pushDir(t, dir, app)
}

// pushDir pushes the tree in dir as app APP with the real git over ssh, as its
// first commit.
func pushDir(t testing.TB, dir, app string) string {
	t.Helper()
	gitEnv := append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=capd", "GIT_AUTHOR_EMAIL=capd@bex", "GIT_COMMITTER_NAME=capd", "GIT_COMMITTER_EMAIL=capd@bex",
		"GIT_SSH_COMMAND="+sshCommand())
	h, p, _ := net.SplitHostPort(env["SSH_ADDR"])
	var out []byte
	var err error
	for _, args := range [][]string{
		{"git", "init", "-q", "-b", "main"},
		{"git", "add", "-A"},
		{"git", "commit", "-q", "-m", "first"},
		{"git", "push", fmt.Sprintf("ssh://git@%s:%s/%s", h, p, app), "main"},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, gitEnv
		if out, err = cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return string(out)
}

// curl GETs https://APP.BASE_DOMAIN/path through the edge at HTTPS_ADDR with the
// real curl, trusting only CA_FILE.
func curl(app, path string) (string, error) { return curlAt(env["HTTPS_ADDR"], app, path) }

// curlAt is curl through the edge at addr (any node's address: the edge runs on
// every node).
func curlAt(addr, app, path string) (string, error) {
	host := app + "." + env["BASE_DOMAIN"]
	ip, _, _ := net.SplitHostPort(addr)
	out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "5", "--cacert", env["CA_FILE"],
		"--resolve", host+":443:"+ip, "https://"+host+path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("curl https://%s%s: %v: %s", host, path, err, out)
	}
	return string(out), nil
}
