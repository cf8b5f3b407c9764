package cluster

import (
	"bufio"
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
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// The one-machine side of the migration test and of the benchmarks: a real `bex up`
// beside the cluster, as cmd/bex/e2e starts it (a state dir of its own, loopback
// ports, the busybox base from Debian's busybox-static since nothing is pulled here).

// bexBin builds ./cmd/bex into t's temporary directory (the Go build cache makes a
// second build take seconds; TestMain, which could build it once, is shared).
func bexBin(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "bex")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/bex")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/bex: %v\n%s", err, out)
	}
	return bin
}

// oneMachine is one `bex up` process.
type oneMachine struct {
	dir                          string // the state dir
	sshAddr, httpAddr, httpsAddr string
	hooksAddr                    string
	keyPath                      string // the admin's private key

	cmd    *exec.Cmd
	out    *testenv.SyncBuffer
	exited chan struct{}
}

// startOneMachine runs bex up with adminKey (a private key; its .pub is given to
// --admin-key) and waits until it says it is up; t.Cleanup stops it by its PID.
func startOneMachine(t testing.TB, adminKey string) *oneMachine {
	t.Helper()
	bin := bexBin(t)
	m := &oneMachine{dir: t.TempDir(), keyPath: adminKey}
	for _, a := range []*string{&m.sshAddr, &m.httpAddr, &m.httpsAddr, &m.hooksAddr} {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		*a = fmt.Sprintf("127.0.0.1:%d", port)
	}
	m.cmd = exec.Command(bin, "up", "--state-dir", m.dir,
		"--ssh-addr", m.sshAddr, "--http-addr", m.httpAddr, "--https-addr", m.httpsAddr,
		"--hooks-addr", m.hooksAddr, "--base-domain", "localhost",
		"--admin-key", adminKey+".pub",
		"--image-resolve-mode", "local", "--busybox-base", "--build-memory", "256Mi")
	if root, err := testenv.RepoRoot(); err == nil {
		m.cmd.Env = append(os.Environ(), "PATH="+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))
	}
	m.out = &testenv.SyncBuffer{}
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.exited = make(chan struct{})
	go func() { _ = m.cmd.Wait(); close(m.exited) }()
	t.Cleanup(func() { m.stop(t) })
	testenv.Eventually(t, 3*time.Minute, "bex up says it is up", func() error {
		select {
		case <-m.exited:
			t.Fatalf("bex up exited (%v):\n%s", m.cmd.ProcessState, m.out)
		default:
		}
		if !strings.Contains(m.out.String(), "bex is up.") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	return m
}

// stop sends bex up SIGTERM (by its PID) and waits for it to exit; it is killed
// after a minute.
func (m *oneMachine) stop(t testing.TB) {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = syscall.Kill(m.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(time.Minute):
		_ = m.cmd.Process.Kill()
		<-m.exited
		t.Errorf("bex up did not stop within a minute of SIGTERM")
	}
}

func (m *oneMachine) kubeconfig() string { return filepath.Join(m.dir, "kubeconfig") }

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// ssh runs a bex command on the one machine as the holder of key.
func (m *oneMachine) ssh(key string, args ...string) (string, error) {
	fields := strings.Fields(sshCommandWith(key))
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", portOf(m.sshAddr), "git@127.0.0.1"), args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (m *oneMachine) remote(app string) string {
	return fmt.Sprintf("ssh://git@127.0.0.1:%s/%s", portOf(m.sshAddr), app)
}

// get GETs path of app through the one machine's edge, trusting only its ca.pem.
func (m *oneMachine) get(app, path string) (int, string, error) {
	pem, err := os.ReadFile(filepath.Join(m.dir, "ca.pem"))
	if err != nil {
		return 0, "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, m.httpsAddr)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := hc.Get(fmt.Sprintf("https://%s.localhost:%s%s", app, portOf(m.httpsAddr), path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// sshCommandWith is the ssh a user holding key runs.
func sshCommandWith(key string) string {
	return "ssh -F /dev/null -i " + key + " -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes"
}

// newKey makes an ed25519 key pair and returns the private key's path.
func newKey(t testing.TB, comment string) string {
	t.Helper()
	k := filepath.Join(t.TempDir(), "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", k).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return k
}

// repoWithKey is newRepo's repository with git's ssh using key, its remotes added
// by the caller.
func repoWithKey(t testing.TB, sample, key string) *repo {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &repo{dir: t.TempDir()}
	r.env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=cluster", "GIT_AUTHOR_EMAIL=cluster@bex", "GIT_COMMITTER_NAME=cluster", "GIT_COMMITTER_EMAIL=cluster@bex",
		"GIT_SSH_COMMAND="+sshCommandWith(key))
	if out, err := exec.Command("cp", "-a", filepath.Join(root, "hack", "samples", sample)+"/.", r.dir).CombinedOutput(); err != nil {
		t.Fatalf("copy sample: %v\n%s", err, out)
	}
	r.git(t, "init", "-q", "-b", "main")
	r.git(t, "add", "-A")
	r.git(t, "commit", "-q", "-m", "first")
	return r
}

// clusterRemote is the cluster gitserver's URL of app.
func clusterRemote(app string) string {
	h, p := sshHostPort()
	return fmt.Sprintf("ssh://git@%s:%s/%s", h, p, app)
}

// lineWith is the first line of s containing sub, or "".
func lineWith(s, sub string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			return sc.Text()
		}
	}
	return ""
}
