package e2e

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
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// bexBinary is bex built once for the whole package.
var bexBinary string

func TestMain(m *testing.M) {
	if os.Getenv(dialHelperEnv) != "" {
		dialHelper()
	}
	dir, err := os.MkdirTemp("", "bex-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bexBinary = filepath.Join(dir, "bex")
	root, err := testenv.RepoRoot()
	if err == nil {
		cmd := exec.Command("go", "build", "-o", bexBinary, "./cmd/bex")
		cmd.Dir = root
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build ./cmd/bex: %v\n%s", berr, out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := testenv.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// platform is one `bex up` process on its own state dir and loopback ports.
type platform struct {
	dir                          string // the state dir
	sshAddr, httpAddr, httpsAddr string
	hooksAddr                    string // webhooks and MCP
	keyPath                      string // the admin's private key

	cmd    *exec.Cmd
	out    *testenv.SyncBuffer
	exited chan struct{}
	// shared: the platform of several tests (sharedPlatform), whose apps are
	// destroyed when the test that made them ends.
	shared bool
	// stdio, when set, is bex up's stdout and stderr in place of out (a pipe
	// whose reader the test controls); launch closes this end once it started.
	stdio *os.File
}

// newPlatform chooses the ports and makes the admin's key; start runs it.
func newPlatform(t testing.TB) *platform {
	t.Helper()
	// t.TempDir and its parent are 0700, as a state dir under /root is: the apps'
	// user namespaces must not need to pass through it (containerd's bundles are in
	// /run/bex).
	p, err := newPlatformIn(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newPlatformIn is newPlatform on a state dir and a directory for the key that
// the caller made.
func newPlatformIn(stateDir, keyDir string) (*platform, error) {
	p := &platform{dir: stateDir}
	if err := p.choosePorts(); err != nil {
		return nil, err
	}
	p.keyPath = filepath.Join(keyDir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e@bex", "-f", p.keyPath).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ssh-keygen: %v\n%s", err, out)
	}
	return p, nil
}

// sharedPlatform is one bex up with the usual flags for the tests that need
// none of their own: each uses apps of its own names and changes nothing of the
// platform's (its users, flags or files), and the apps it makes are destroyed
// when it ends (newRepo), so that what one test left running (cron jobs,
// instances) neither loads nor confuses the next. The first test that asks
// starts it; testenv.Run stops it after the last test, as a user would, and
// fails the run if it does not stop cleanly or leaves a process.
func sharedPlatform(t *testing.T) *platform {
	t.Helper()
	return sharedUp(t, "bex-up")
}

// sharedUp is the bex up called name, with extra flags after the usual ones,
// started by the first test that asks for it and stopped by testenv.Run.
func sharedUp(t *testing.T, name string, extra ...string) *platform {
	t.Helper()
	return testenv.Shared(t, name, func(dir string) (*platform, func() error, error) {
		if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
			return nil, nil, err
		}
		p, err := newPlatformIn(filepath.Join(dir, "state"), dir)
		if err != nil {
			return nil, nil, err
		}
		p.shared = true
		if err := p.launch(extra...); err != nil {
			return nil, nil, err
		}
		return p, p.shutdown, nil
	})
}

// start runs bex up, with extra flags after the usual ones, and waits until it
// says it is up. The caller registers t.Cleanup(p.kill) once, on the test that
// owns the platform.
func (p *platform) start(t testing.TB, extra ...string) {
	t.Helper()
	if err := p.launch(extra...); err != nil {
		t.Fatal(err)
	}
}

// choosePorts gives the platform's listeners ports that are free now.
func (p *platform) choosePorts() error {
	for _, a := range []*string{&p.sshAddr, &p.httpAddr, &p.httpsAddr, &p.hooksAddr} {
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		*a = fmt.Sprintf("127.0.0.1:%d", port)
	}
	return nil
}

// launch is start without a test: the shared platform's. A port chosen free a
// moment before can be taken before bex up binds it (by another test binary's
// daemon, or by bex up's own API server choosing the same free port): a first
// start that fails so is made again on other ports. A later start keeps its
// ports, which the test's repositories name.
func (p *platform) launch(extra ...string) error {
	first := p.cmd == nil
	for attempt := 1; ; attempt++ {
		err := p.launchOnce(extra...)
		if err == nil || !first || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
		if err := p.choosePorts(); err != nil {
			return err
		}
	}
}

func (p *platform) launchOnce(extra ...string) error {
	p.cmd = p.upCommand(append([]string{"--state-dir", p.dir,
		"--ssh-addr", p.sshAddr, "--http-addr", p.httpAddr, "--https-addr", p.httpsAddr,
		"--hooks-addr", p.hooksAddr, "--base-domain", "localhost",
		"--admin-key", p.keyPath + ".pub",
		// Nothing can be pulled here: builds use the busybox base that bex up
		// makes from Debian's busybox-static, as make run does on such a machine.
		"--image-resolve-mode", "local", "--busybox-base",
		// Small enough for a test step to pass it without taking the machine's memory.
		"--build-memory", "256Mi"}, extra...)...)
	if p.out == nil {
		p.out = &testenv.SyncBuffer{}
	}
	// What an earlier start printed is not this start's "bex is up.".
	before := len(p.out.String())
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if p.stdio != nil {
		p.cmd.Stdout, p.cmd.Stderr = p.stdio, p.stdio
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := p.cmd.Start()
	if p.stdio != nil {
		p.stdio.Close()
	}
	if err != nil {
		return err
	}
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	// Until it says it is up, or exits: an exit ends the wait at once.
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(p.out.String()[before:], "bex is up.") {
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("bex up does not say it is up after 3m:\n%s", p.out)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("bex up exited (%v):\n%s", p.cmd.ProcessState, p.out)
		case <-time.After(20 * time.Millisecond): // no wait: how often its output is read
		}
	}
	return nil
}

// upCommand is `bex up args...`, finding the daemons `make tools` built in bin/.
func (p *platform) upCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(bexBinary, append([]string{"up"}, args...)...)
	if root, err := testenv.RepoRoot(); err == nil {
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))
	}
	return cmd
}

// kill ends bex up at once, for a test that failed midway.
func (p *platform) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(time.Minute):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// stop stops bex up as a user would, with SIGTERM, and checks that it exits cleanly
// and leaves no process behind.
func (p *platform) stop(t testing.TB) {
	t.Helper()
	began := time.Now()
	if err := p.shutdown(); err != nil {
		t.Fatal(err)
	}
	t.Logf("bex up stopped in %s", time.Since(began).Round(time.Millisecond))
}

// shutdown is stop without a test: the shared platform's.
func (p *platform) shutdown() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		p.cmd.Process.Kill()
		return fmt.Errorf("bex up did not stop within 2 minutes of SIGTERM:\n%s", p.out)
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("bex up exited with %v:\n%s", p.cmd.ProcessState, p.out)
	}
	// containerd's shims are the processes most likely to outlive it: they are
	// found by the state dir in their command line, as is everything else bex up
	// started.
	if err := testenv.Poll(10*time.Second, func() error {
		if left := processesMentioning(p.dir); len(left) > 0 {
			return fmt.Errorf("left:\n%s", strings.Join(left, "\n"))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("a process is left after bex up stopped: %v", err)
	}
	return nil
}

// processesMentioning lists the live processes whose command line contains s.
func processesMentioning(s string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(s)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // a zombie: it has exited
		}
		found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return found
}

func (p *platform) port(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// sshCommand is the ssh a user runs, with the admin's key.
func (p *platform) sshCommand() string {
	return "ssh -F /dev/null -i " + p.keyPath + " -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes"
}

// remote is the git remote of app.
func (p *platform) remote(app string) string {
	return fmt.Sprintf("ssh://git@127.0.0.1:%s/%s", p.port(p.sshAddr), app)
}

// ssh runs a bex command over ssh as the admin and returns stdout, stderr and the
// exit error.
func (p *platform) ssh(t testing.TB, args ...string) (string, string, error) {
	t.Helper()
	fields := strings.Fields(p.sshCommand())
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", p.port(p.sshAddr), "git@127.0.0.1"), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// kubectl runs kubectl with bex up's kubeconfig.
func (p *platform) kubectl(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", filepath.Join(p.dir, "kubeconfig")}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// https GETs path of app through the edge, trusting only bex's ca.pem.
func (p *platform) https(app, path string) (int, string, error) {
	hc, err := p.httpsClient()
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Get(fmt.Sprintf("https://%s.localhost:%s%s", app, p.port(p.httpsAddr), path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// httpsClient reaches the edge for any host, trusting only bex's ca.pem.
func (p *platform) httpsClient() (*http.Client, error) {
	pem, err := os.ReadFile(filepath.Join(p.dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca.pem holds no certificate")
	}
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			// <app>.localhost is loopback, as browsers and curl treat it.
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, p.httpsAddr)
			},
			DisableKeepAlives: true,
		},
	}, nil
}

// answers checks that app's path answers 200 with a body containing want.
func (p *platform) answers(app, path, want string) func() error {
	return func() error {
		code, body, err := p.https(app, path)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, want) {
			return fmt.Errorf("%s%s: %d %q, want 200 with %q", app, path, code, body, want)
		}
		return nil
	}
}

// repo is a git working copy of an app, pushed to bex.
type repo struct {
	dir string
	env []string
}

// newRepo copies sample (a directory of hack/samples) into a new repository with one
// commit, its remote "bex" pointing at app.
func (p *platform) newRepo(t testing.TB, sample, app string) *repo {
	t.Helper()
	return p.newRepoFrom(t, filepath.Join("hack", "samples", sample), app)
}

// newRepoFrom copies dir (absolute, or relative to the repository's root) into a
// new repository with one commit, its remote "bex" pointing at app.
func (p *platform) newRepoFrom(t testing.TB, dir, app string) *repo {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.IsAbs(dir) {
		root = "/"
	}
	r := &repo{dir: t.TempDir()}
	home := t.TempDir()
	r.env = append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@bex", "GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@bex",
		"GIT_SSH_COMMAND="+p.sshCommand())
	if out, err := exec.Command("cp", "-a", filepath.Join(root, dir)+"/.", r.dir).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", dir, err, out)
	}
	r.git(t, "init", "-q", "-b", "main")
	r.git(t, "add", "-A")
	r.git(t, "commit", "-q", "-m", "first")
	r.git(t, "remote", "add", "bex", p.remote(app))
	if p.shared {
		t.Cleanup(func() { p.destroyApp(t, app) })
	}
	return r
}

// destroyApp destroys app and waits until its App is gone (the deployer stopped
// its processes first): the next test on a shared platform starts without it.
func (p *platform) destroyApp(t testing.TB, app string) {
	t.Helper()
	if _, stderr, err := p.ssh(t, "apps:destroy", app, "--confirm", app); err != nil {
		if !strings.Contains(stderr, "no app") {
			t.Errorf("apps:destroy %s: %v: %s", app, err, stderr)
		}
		return
	}
	testenv.Eventually(t, 2*time.Minute, app+" is gone", func() error {
		if out := p.kubectl(t, "get", "apps.app.bex.co", "--ignore-not-found", app, "-o", "name"); out != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
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

// commit writes files and commits them.
func (r *repo) commit(t testing.TB, msg string, files map[string]string) string {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.git(t, "add", "-A")
	r.git(t, "commit", "-q", "-m", msg)
	return strings.TrimSpace(r.git(t, "rev-parse", "HEAD"))
}

// push pushes main and returns git's output.
func (r *repo) push() (string, error) { return r.tryGit("push", "bex", "main") }

// remoteHead is what bex's main points at.
func (r *repo) remoteHead(t testing.TB) string {
	t.Helper()
	out := r.git(t, "ls-remote", "bex", "refs/heads/main")
	f := strings.Fields(out)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// lines returns the lines of s that contain sub, for messages.
func lines(s, sub string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return out
}
