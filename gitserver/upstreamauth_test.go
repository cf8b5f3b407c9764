package gitserver_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

// gitHost is a git host that serves repositories over ssh (git upload-pack, as
// GitHub and Gitea do) to the deploy keys it trusts, and records every key a
// client offers.
type gitHost struct {
	addr    string
	hostKey gossh.PublicKey
	root    string

	mu      sync.Mutex
	trusted map[string]bool // fingerprints
	offered []string
	conns   atomic.Int32
}

func startGitHost(t *testing.T, root string) *gitHost {
	t.Helper()
	h := &gitHost{root: root, trusted: map[string]bool{}}
	hk := testenv.NewSSHKey(t)
	h.hostKey = hk.Signer.PublicKey()
	srv := &ssh.Server{
		HostSigners: []ssh.Signer{hk.Signer},
		ConnCallback: func(_ ssh.Context, c net.Conn) net.Conn {
			h.conns.Add(1)
			return c
		},
		PublicKeyHandler: func(_ ssh.Context, key ssh.PublicKey) bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			fp := gossh.FingerprintSHA256(key)
			h.offered = append(h.offered, fp)
			return h.trusted[fp]
		},
		Handler: func(s ssh.Session) {
			// go-git runs "git-upload-pack '/path'".
			repo, ok := strings.CutPrefix(s.RawCommand(), "git-upload-pack ")
			if !ok {
				_ = s.Exit(1)
				return
			}
			cmd := exec.Command("git", "upload-pack", filepath.Join(h.root, strings.Trim(repo, "'")))
			cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s.Stderr()
			if err := cmd.Run(); err != nil {
				_ = s.Exit(1)
				return
			}
			_ = s.Exit(0)
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h
}

func (h *gitHost) trust(keys ...gossh.PublicKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trusted = map[string]bool{}
	for _, k := range keys {
		h.trusted[gossh.FingerprintSHA256(k)] = true
	}
}

func (h *gitHost) wasOffered(k gossh.PublicKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fp := range h.offered {
		if fp == gossh.FingerprintSHA256(k) {
			return true
		}
	}
	return false
}

// knownHost writes the git host's key into the gitserver's upstream known
// hosts, under each of the names given ("127.0.0.1:PORT", "localhost:PORT").
func (e *env) knownHost(key gossh.PublicKey, addrs ...string) {
	e.t.Helper()
	var lines string
	for _, a := range addrs {
		lines += knownhosts.Line([]string{knownhosts.Normalize(a)}, key) + "\n"
	}
	if err := os.WriteFile(filepath.Join(e.state, "upstream_known_hosts"), []byte(lines), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// publicResolver says every name is a public address: the answer of a DNS
// server that rebinds, at the time an upstream is checked.
type publicResolver struct{}

func (publicResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("140.82.112.3")}, nil
}

// TestUpstreamDeployKeys: each app fetches its ssh upstream with a deploy key of
// its own, never the server's host key. A git host that trusts app alpha's key
// serves alpha, refuses beta pointed at the same repository, and after alpha's
// key is rotated refuses the old one.
func TestUpstreamDeployKeys(t *testing.T) {
	var upstreams *hooksecrets.Upstreams
	e := newEnvPipeline(t, []pipeline.Option{pipeline.WithUpstreamAuth(lazyUpstreams{&upstreams})},
		func(c *config) { c.AllowPrivateUpstreams = true }) // the git host is on loopback
	upstreams = &hooksecrets.Upstreams{Client: e.cp.Client, Namespace: e.ns}
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("alpha")
	e.createApp("beta")
	root := t.TempDir()
	src := filepath.Join(root, "shop.git")
	ana.mustGit(root, "init", "-q", "-b", "main", src)
	first := ana.commit(src, "app.txt", "v1\n")
	host := startGitHost(t, root)
	e.knownHost(host.hostKey, host.addr)
	url := "ssh://git@" + host.addr + "/shop.git"

	ctx := context.Background()
	keyA, err := upstreams.DeployKey(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := upstreams.DeployKey(ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := upstreams.DeployKey(ctx, "alpha"); again == nil || !same(again.PublicKey(), keyA.PublicKey()) {
		t.Fatal("alpha's deploy key changed when read again")
	}
	if same(keyA.PublicKey(), keyB.PublicKey()) || same(keyA.PublicKey(), e.srv.HostKey()) || keyA.PublicKey().Type() != gossh.KeyAlgoED25519 {
		t.Fatalf("deploy keys: alpha %s, beta %s, host %s", gossh.FingerprintSHA256(keyA.PublicKey()),
			gossh.FingerprintSHA256(keyB.PublicKey()), gossh.FingerprintSHA256(e.srv.HostKey()))
	}
	host.trust(keyA.PublicKey())

	deploy := func(app string) (*pipeline.DeployResult, error) {
		return e.pl.Deploy(ctx, pipeline.DeployRequest{App: app, Upstream: url, Cause: pipeline.CauseWebhook, Actor: "webhook:github"}, nil)
	}
	res, err := deploy("alpha")
	if err != nil || res.Commit != first {
		t.Fatalf("alpha, whose key the git host trusts: %+v %v", res, err)
	}
	// The attack: beta names alpha's repository.
	_, err = deploy("beta")
	if !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("beta, whose key the git host does not trust: %v", err)
	}
	if !host.wasOffered(keyB.PublicKey()) || host.wasOffered(e.srv.HostKey()) {
		t.Fatal("beta did not offer its own key, or the host key was offered")
	}

	// Rotation: the old key stops fetching at once; the new one, once trusted,
	// fetches.
	app := &appv1.App{}
	if err := e.cp.Client.Get(ctx, keyOf(e, "alpha"), app); err != nil {
		t.Fatal(err)
	}
	rotated, err := upstreams.RotateDeployKey(ctx, app)
	if err != nil || same(rotated.PublicKey(), keyA.PublicKey()) {
		t.Fatalf("rotate: %v", err)
	}
	second := ana.commit(src, "app.txt", "v2\n")
	if _, err := deploy("alpha"); !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("alpha after the rotation, the git host still trusting the old key: %v", err)
	}
	host.trust(rotated.PublicKey())
	if res, err := deploy("alpha"); err != nil || res.Commit != second {
		t.Fatalf("alpha with its new key trusted: %+v %v", res, err)
	}
	if host.wasOffered(e.srv.HostKey()) {
		t.Fatal("the host key was offered to the git host")
	}
}

// TestUpstreamDialIsChecked: an ssh upstream named by a name that was public
// when checked and is loopback when dialed (DNS rebinding) is never connected to.
func TestUpstreamDialIsChecked(t *testing.T) {
	var upstreams *hooksecrets.Upstreams
	e := newEnvPipeline(t, []pipeline.Option{pipeline.WithUpstreamAuth(lazyUpstreams{&upstreams})},
		func(c *config) { c.UpstreamResolver = publicResolver{} })
	upstreams = &hooksecrets.Upstreams{Client: e.cp.Client, Namespace: e.ns}
	e.createApp("alpha")
	host := startGitHost(t, t.TempDir())
	_, port, _ := net.SplitHostPort(host.addr)
	e.knownHost(host.hostKey, host.addr, "localhost:"+port)
	url := "ssh://git@localhost:" + port + "/shop.git"
	_, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "alpha", Upstream: url, Cause: pipeline.CauseWebhook}, nil)
	if !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "127.0.0.1 is a loopback address") {
		t.Fatalf("%s: %v", url, err)
	}
	// A literal address is refused before any dial.
	_, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "alpha", Upstream: "ssh://git@" + host.addr + "/shop.git", Cause: pipeline.CauseWebhook}, nil)
	if !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("literal loopback: %v", err)
	}
	if n := host.conns.Load(); n != 0 {
		t.Fatalf("the git host on loopback got %d connections", n)
	}
}

// TestUpstreamCredentials: an https upstream that wants a password is fetched
// with the one kept for the app (http basic auth, git http-backend behind it),
// and the password shows up in no log line or progress message.
func TestUpstreamCredentials(t *testing.T) {
	const password = "s3cret-upstream-pw"
	root := t.TempDir()
	var hits atomic.Int32
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	backendCGI := &cgi.Handler{Path: gitPath, Args: []string{"http-backend"}, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backendCGI.ServeHTTP(w, r)
	}))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	var upstreams *hooksecrets.Upstreams
	e := newEnvPipeline(t, []pipeline.Option{pipeline.WithUpstreamAuth(lazyUpstreams{&upstreams})}, func(c *config) {
		c.AllowPrivateUpstreams, c.UpstreamRootCAs = true, roots // the git host is on loopback
	})
	upstreams = &hooksecrets.Upstreams{Client: e.cp.Client, Namespace: e.ns}
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("alpha")
	src := filepath.Join(root, "shop.git")
	ana.mustGit(root, "init", "-q", "-b", "main", src)
	first := ana.commit(src, "app.txt", "v1\n")
	url := srv.URL + "/shop.git"
	ctx := context.Background()
	var progress strings.Builder
	deploy := func() (*pipeline.DeployResult, error) {
		return e.pl.Deploy(ctx, pipeline.DeployRequest{App: "alpha", Upstream: url, Cause: pipeline.CauseWebhook}, &progress)
	}

	if _, err := deploy(); !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "authentication required") {
		t.Fatalf("without credentials: %v", err)
	}
	app := &appv1.App{}
	if err := e.cp.Client.Get(ctx, keyOf(e, "alpha"), app); err != nil {
		t.Fatal(err)
	}
	if err := upstreams.SetCredentials(ctx, app, "ci", password); err != nil {
		t.Fatal(err)
	}
	if res, err := deploy(); err != nil || res.Commit != first {
		t.Fatalf("with the kept credentials: %+v %v", res, err)
	}
	// A wrong password is refused, and is not shown either.
	if err := upstreams.SetCredentials(ctx, app, "ci", "wrong-"+password); err != nil {
		t.Fatal(err)
	}
	ana.commit(src, "app.txt", "v2\n")
	if _, err := deploy(); err == nil || strings.Contains(err.Error(), password) {
		t.Fatalf("a wrong password: %v", err)
	}
	if strings.Contains(e.logs.String(), password) || strings.Contains(progress.String(), password) {
		t.Fatalf("the password was logged or shown:\n%s\n%s", e.logs.String(), progress.String())
	}
	if hits.Load() == 0 {
		t.Fatal("the git host was never reached")
	}

	// Credentials in the URL itself are refused before anything is dialed.
	n := hits.Load()
	withCreds := strings.Replace(srv.URL, "https://", "https://ci:"+password+"@", 1) + "/shop.git"
	_, err = e.pl.Deploy(ctx, pipeline.DeployRequest{App: "alpha", Upstream: withCreds, Cause: pipeline.CauseWebhook}, &progress)
	if err == nil || !strings.Contains(err.Error(), "--password-stdin") || strings.Contains(err.Error(), password) {
		t.Fatalf("credentials in the URL: %v", err)
	}
	if hits.Load() != n || strings.Contains(e.logs.String(), password) || strings.Contains(progress.String(), password) {
		t.Fatal("a URL with credentials was fetched, logged or shown")
	}
}

// lazyUpstreams is the store once the env has made the namespace it needs.
type lazyUpstreams struct{ p **hooksecrets.Upstreams }

func (l lazyUpstreams) DeployKey(ctx context.Context, app string) (gossh.Signer, error) {
	return (*l.p).DeployKey(ctx, app)
}

func (l lazyUpstreams) Credentials(ctx context.Context, app string) (string, string, bool, error) {
	return (*l.p).Credentials(ctx, app)
}

func keyOf(e *env, app string) client.ObjectKey { return client.ObjectKey{Namespace: e.ns, Name: app} }

func same(a, b gossh.PublicKey) bool { return string(a.Marshal()) == string(b.Marshal()) }
