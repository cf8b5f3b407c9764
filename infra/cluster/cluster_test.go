package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/infra/testapps"
	"bex.co/bex/internal/testenv"
)

// env is the cluster's cluster.env, read by TestMain.
var env map[string]string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if f := os.Getenv("BEX_TEST_CLUSTER_ENV"); f != "" {
		var err error
		if env, err = readEnv(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Short: containerd's and the kubelet's sockets live under it.
	dir, err := os.MkdirTemp("/tmp", "bex-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	script := filepath.Join(root, "hack", "cluster-local.sh")
	down := func() int {
		out, err := exec.Command(script, "down", dir).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "hack/cluster-local.sh down %s: %v\n%s", dir, err, out)
			return 1
		}
		_ = os.RemoveAll(dir)
		return 0
	}
	start := time.Now()
	out, err := exec.Command(script, "up", dir).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hack/cluster-local.sh up %s: %v\n%s\n", dir, err, out)
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

// dumpLogs prints the end of each daemon's log and bex's pods, for a failed run.
func dumpLogs(dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		out, _ := exec.Command("tail", "-n", "20", l).Output()
		fmt.Fprintf(os.Stderr, "--- %s\n%s", l, out)
	}
	if k, err := testenv.Binary("kubectl"); err == nil {
		out, _ := exec.Command(k, "--kubeconfig", filepath.Join(dir, "kubeconfig"), "get", "pods", "-A", "-o", "wide").CombinedOutput()
		fmt.Fprintf(os.Stderr, "--- pods\n%s", out)
		out, _ = exec.Command(k, "--kubeconfig", filepath.Join(dir, "kubeconfig"), "-n", "bex-system", "logs", "--all-containers", "--prefix", "--tail", "30", "-l", "app.kubernetes.io/part-of=bex").CombinedOutput()
		fmt.Fprintf(os.Stderr, "--- bex's logs\n%s", out)
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
	for _, k := range []string{"KUBECONFIG", "SSH_ADDR", "HTTPS_ADDR", "BASE_DOMAIN", "CA_FILE", "ADMIN_IDENTITY"} {
		if e[k] == "" {
			return nil, fmt.Errorf("%s has no %s= line", path, k)
		}
	}
	return e, nil
}

// sshCommand is the ssh a user runs, with the admin's key.
func sshCommand() string {
	return "ssh -F /dev/null -i " + env["ADMIN_IDENTITY"] + " -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes"
}

func sshHostPort() (string, string) {
	h, p, _ := net.SplitHostPort(env["SSH_ADDR"])
	return h, p
}

// bex runs a bex command over ssh as the admin: stdout, stderr and the exit error.
func bex(args ...string) (string, string, error) {
	h, p := sshHostPort()
	fields := strings.Fields(sshCommand())
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", p, "git@"+h), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// kubectl runs the real kubectl on the cluster.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", env["KUBECONFIG"]}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// curl GETs https://APP.BASE_DOMAIN/path through the edge with the real curl,
// trusting only CA_FILE.
func curl(app, path string) (string, error) {
	host := app + "." + env["BASE_DOMAIN"]
	ip, _, _ := net.SplitHostPort(env["HTTPS_ADDR"])
	out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "10", "--cacert", env["CA_FILE"],
		"--resolve", host+":443:"+ip, "https://"+host+path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("curl https://%s%s: %v: %s", host, path, err, out)
	}
	return string(out), nil
}

// httpsClient reaches the edge for any host, trusting only CA_FILE.
func httpsClient(t testing.TB) *http.Client {
	pem, err := os.ReadFile(env["CA_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", env["CA_FILE"])
	}
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, env["HTTPS_ADDR"])
			},
			DisableKeepAlives: true,
		},
	}
}

func get(hc *http.Client, app, path string) (int, string, error) {
	resp, err := hc.Get("https://" + app + "." + env["BASE_DOMAIN"] + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// repo is a git working copy of an app, pushed to the cluster's gitserver.
type repo struct {
	dir string
	env []string
}

// newRepo copies sample (a directory of hack/samples) into a new repository with
// one commit, its remote "bex" pointing at app. An app of that name left by an
// earlier run on the same cluster (BEX_TEST_CLUSTER_ENV) is destroyed first.
func newRepo(t testing.TB, sample, app string) *repo {
	t.Helper()
	if _, _, err := bex("apps:info", app); err == nil {
		if _, stderr, err := bex("apps:destroy", app, "--confirm", app); err != nil {
			t.Fatalf("apps:destroy %s: %v: %s", app, err, stderr)
		}
		testenv.Eventually(t, time.Minute, "the old "+app+" is gone", func() error {
			if _, _, err := bex("apps:info", app); err == nil {
				return fmt.Errorf("%s is still there", app)
			}
			return nil
		})
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &repo{dir: t.TempDir()}
	r.env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=cluster", "GIT_AUTHOR_EMAIL=cluster@bex", "GIT_COMMITTER_NAME=cluster", "GIT_COMMITTER_EMAIL=cluster@bex",
		"GIT_SSH_COMMAND="+sshCommand())
	if out, err := exec.Command("cp", "-a", filepath.Join(root, "hack", "samples", sample)+"/.", r.dir).CombinedOutput(); err != nil {
		t.Fatalf("copy sample: %v\n%s", err, out)
	}
	r.git(t, "init", "-q", "-b", "main")
	r.git(t, "add", "-A")
	r.git(t, "commit", "-q", "-m", "first")
	h, p := sshHostPort()
	r.git(t, "remote", "add", "bex", fmt.Sprintf("ssh://git@%s:%s/%s", h, p, app))
	return r
}

// probeDockerfile runs the probe (testdata/probe) as the app.
const probeDockerfile = testapps.ProbeDockerfile

// probeRepo is newRepo of app with the probe program (testdata/probe) built into
// its tree, not committed yet: a test commits the Dockerfile that runs it
// (probeDockerfile, or one of its own). The app is destroyed when the test ends.
func probeRepo(t testing.TB, app string) *repo {
	t.Helper()
	t.Cleanup(func() { _, _, _ = bex("apps:destroy", app, "--confirm", app) })
	r := newRepo(t, "hello-shell", app)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := testapps.BuildProbe(root, r.dir); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *repo) git(t testing.TB, args ...string) string {
	t.Helper()
	out, err := r.tryGit(args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (r *repo) tryGit(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = r.dir, r.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// push pushes main to bex and returns git's output.
func (r *repo) push() (string, error) { return r.tryGit("push", "bex", "main") }

// commit writes files and commits them.
func (r *repo) commit(t testing.TB, msg string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.git(t, "add", "-A")
	r.git(t, "commit", "-q", "-m", msg)
}
