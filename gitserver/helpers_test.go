package gitserver_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChildServer())
	}
	os.Exit(testenv.Run(m))
}

// env is one gitserver on 127.0.0.1 with its own state directory, its apps in a
// namespace of their own on the shared control plane, its pipeline with a fake
// builder and releaser.
type env struct {
	t        testing.TB
	srv      *gitserver.Server
	pl       *pipeline.Pipeline
	addr     string
	state    string
	ns       string
	cp       *testenv.ControlPlane
	builder  *fakeBuilder
	releaser *fakeReleaser
	logs     *testenv.SyncBuffer
	dir      gitserver.Directory
}

// config is both halves of a test server's configuration, the SSH server's
// and its pipeline's, as one: StateDir goes to both.
type config struct {
	*sshConfig
	*pipelineConfig
	StateDir string
}

type (
	sshConfig      = gitserver.Config
	pipelineConfig = pipeline.Config
)

func newEnv(t testing.TB, tweak ...func(*config)) *env {
	t.Helper()
	return newEnvWith(t, nil, tweak...)
}

// newEnvWith is newEnv with server options.
func newEnvWith(t testing.TB, opts []gitserver.Option, tweak ...func(*config)) *env {
	t.Helper()
	return newEnvOpts(t, opts, nil, tweak...)
}

// newEnvPipeline is newEnv with pipeline options.
func newEnvPipeline(t testing.TB, opts []pipeline.Option, tweak ...func(*config)) *env {
	t.Helper()
	return newEnvOpts(t, nil, opts, tweak...)
}

// newEnvOpts is newEnv with server and pipeline options.
func newEnvOpts(t testing.TB, opts []gitserver.Option, popts []pipeline.Option, tweak ...func(*config)) *env {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "git")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir, informers, err := access.Start(ctx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ns: ns, cp: cp, state: t.TempDir(), builder: &fakeBuilder{}, releaser: &fakeReleaser{}, logs: &testenv.SyncBuffer{}, dir: dir}
	scfg, pcfg := gitserver.DefaultConfig(), pipeline.DefaultConfig()
	cfg := config{sshConfig: &scfg, pipelineConfig: &pcfg, StateDir: e.state}
	cfg.Addr = "127.0.0.1:0"
	cfg.KeepAlive = 200 * time.Millisecond
	for _, f := range tweak {
		f(&cfg)
	}
	scfg.StateDir, pcfg.StateDir = cfg.StateDir, cfg.StateDir
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.pl, err = pipeline.New(pcfg, dir, e.builder, e.releaser, log, nil, popts...)
	if err != nil {
		t.Fatal(err)
	}
	be, err := newBackend(cp.Client, informers, ns, log)
	if err != nil {
		t.Fatal(err)
	}
	e.srv, err = gitserver.New(scfg, dir, be, e.pl, log, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	go func() { _ = e.srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.srv.Shutdown(ctx)
		e.pl.Shutdown(ctx)
		if t.Failed() {
			t.Logf("server log:\n%s", e.logs.String())
		}
	})
	return e
}

// user is a User object and the private key file of its one SSH key.
type user struct {
	name    string
	keyPath string
	signer  gossh.Signer
	key     *testenv.SSHKey
	env     *env
}

// addUser creates a User with a new ed25519 key. Names get the env's namespace as a
// suffix, since Users are cluster-scoped and the control plane is shared.
func (e *env) addUser(name string, role appv1.UserRole, canCreateApps bool) *user {
	e.t.Helper()
	u := e.newKey(name)
	obj := &appv1.User{
		ObjectMeta: metav1.ObjectMeta{Name: u.name},
		Spec: appv1.UserSpec{Role: role, CanCreateApps: canCreateApps, Keys: []appv1.SSHKey{
			{Name: "laptop", PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(u.signer.PublicKey())))},
		}},
	}
	if err := e.cp.Client.Create(context.Background(), obj); err != nil {
		e.t.Fatal(err)
	}
	// The directory reads through an informer: wait until it knows the key.
	e.eventually(func() error {
		_, err := e.dir.UserByKey(context.Background(), u.signer.PublicKey())
		return err
	})
	return u
}

// newKey makes a key pair for name without registering it anywhere.
func (e *env) newKey(name string) *user {
	e.t.Helper()
	k := testenv.NewSSHKey(e.t)
	return &user{name: name + "-" + e.ns, keyPath: k.Path, signer: k.Signer, key: k, env: e}
}

// grant lists u in app's members.
func (e *env) createApp(name string, members ...*user) {
	e.t.Helper()
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}}
	for _, m := range members {
		app.Spec.Members = append(app.Spec.Members, m.name)
	}
	if err := e.cp.Client.Create(context.Background(), app); err != nil {
		e.t.Fatal(err)
	}
	e.eventually(func() error {
		_, err := e.dir.App(context.Background(), name)
		return err
	})
}

func (e *env) eventually(f func() error) {
	e.t.Helper()
	testenv.Eventually(e.t, 10*time.Second, "condition", f)
}

func (e *env) url(app string) string { return "ssh://git@" + e.addr + "/" + app }

func (e *env) repoDir(app string) string { return filepath.Join(e.state, "repos", app+".git") }

// gitCmd is the real git, using u's key through the real ssh client.
func (u *user) gitCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(gitEnv(dir),
		"GIT_SSH_COMMAND=ssh -F /dev/null -i "+u.keyPath+" -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes")
	return cmd
}

// git runs git and returns its combined output and error.
func (u *user) git(dir string, args ...string) (string, error) {
	out, err := u.gitCmd(dir, args...).CombinedOutput()
	return string(out), err
}

// mustGit runs git and fails the test on error.
func (u *user) mustGit(dir string, args ...string) string {
	u.env.t.Helper()
	out, err := u.git(dir, args...)
	if err != nil {
		u.env.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func gitEnv(home string) []string {
	return append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=bex test", "GIT_AUTHOR_EMAIL=test@bex.co", "GIT_COMMITTER_NAME=bex test", "GIT_COMMITTER_EMAIL=test@bex.co")
}

// workdir makes a repository with one commit on main and bex as a remote for app.
func (u *user) workdir(app string) string {
	u.env.t.Helper()
	dir := u.env.t.TempDir()
	u.mustGit(dir, "init", "-q", "-b", "main")
	u.commit(dir, "app.txt", "hello\n")
	u.mustGit(dir, "remote", "add", "bex", u.env.url(app))
	return dir
}

// commit writes file and commits it, returning the new commit id.
func (u *user) commit(dir, file, content string) string {
	u.env.t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
		u.env.t.Fatal(err)
	}
	u.mustGit(dir, "add", file)
	u.mustGit(dir, "commit", "-q", "-m", "change "+file)
	return strings.TrimSpace(u.mustGit(dir, "rev-parse", "HEAD"))
}

// remoteRef is the value of ref in app's repository on the server ("" if none).
func (e *env) remoteRef(app, ref string) string {
	out, err := exec.Command("git", "--git-dir", e.repoDir(app), "rev-parse", "--verify", "-q", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// fakeBuilder records builds and plays a build: progress lines, then an image
// named after the commit. hook, when set, runs in the middle and may fail it.
type fakeBuilder struct {
	mu     sync.Mutex
	builds []pipeline.BuildRequest
	hook   func(ctx context.Context, req pipeline.BuildRequest, progress io.Writer) error
}

func (b *fakeBuilder) Build(ctx context.Context, req pipeline.BuildRequest, progress io.Writer) (*pipeline.BuildResult, error) {
	b.mu.Lock()
	b.builds = append(b.builds, req)
	hook := b.hook
	b.mu.Unlock()
	fmt.Fprintf(progress, "-----> [1/2] FROM scratch\n")
	if hook != nil {
		if err := hook(ctx, req, progress); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(progress, "-----> [2/2] COPY . /app\n")
	sum := sha256.Sum256([]byte(req.Commit))
	return &pipeline.BuildResult{Image: fmt.Sprintf("registry.local/%s@sha256:%x", req.App, sum)}, nil
}

func (b *fakeBuilder) setHook(h func(ctx context.Context, req pipeline.BuildRequest, progress io.Writer) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hook = h
}

func (b *fakeBuilder) all() []pipeline.BuildRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]pipeline.BuildRequest(nil), b.builds...)
}

// fakeReleaser numbers releases per app and reports them served at once, unless
// fail says otherwise.
type fakeReleaser struct {
	mu       sync.Mutex
	releases []pipeline.ReleaseRequest
	numbers  map[string]int64
	served   map[string]int64
	fail     func(app string, n int64) error
}

func (d *fakeReleaser) Release(_ context.Context, req pipeline.ReleaseRequest) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.numbers == nil {
		d.numbers = map[string]int64{}
	}
	d.numbers[req.App]++
	d.releases = append(d.releases, req)
	return d.numbers[req.App], nil
}

func (d *fakeReleaser) WaitRollout(_ context.Context, app string, n int64, progress io.Writer) (string, error) {
	d.mu.Lock()
	fail := d.fail
	d.mu.Unlock()
	fmt.Fprintf(progress, "       web.1 started\n")
	if fail != nil {
		if err := fail(app, n); err != nil {
			return "", err
		}
	}
	d.mu.Lock()
	if d.served == nil {
		d.served = map[string]int64{}
	}
	d.served[app] = n
	d.mu.Unlock()
	return "https://" + app + ".bex.test", nil
}

func (d *fakeReleaser) Serving(_ context.Context, app string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.served[app], nil
}

func (d *fakeReleaser) all() []pipeline.ReleaseRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]pipeline.ReleaseRequest(nil), d.releases...)
}

// nopPipeline is a pipeline in state that knows no app, for servers that take
// no push.
func nopPipeline(t testing.TB, state string) *pipeline.Pipeline {
	t.Helper()
	cfg := pipeline.DefaultConfig()
	cfg.StateDir = state
	pl, err := pipeline.New(cfg, nopDirectory{}, &fakeBuilder{}, &fakeReleaser{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// nopDirectory knows nobody: for tests that never authenticate.
type nopDirectory struct{}

func (nopDirectory) UserByKey(context.Context, gossh.PublicKey) (*backend.User, error) {
	return nil, gitserver.ErrUnknownKey
}
func (nopDirectory) App(context.Context, string) (*pipeline.App, error) {
	return nil, pipeline.ErrAppNotFound
}

// newBackend is the backend that admits the pushes of a test's server, on the
// API (c) and the directory's cache (r). The pushes' releases go through the
// pipeline's releaser, so the backend's own is never asked.
func newBackend(c client.Client, r client.Reader, ns string, log *slog.Logger) (*backend.Backend, error) {
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Reader, cfg.Namespace, cfg.Releases, cfg.Log = c, r, ns, nopReleases{}, log
	return backend.New(cfg)
}

// nopReleases is a backend.Releases for servers whose tests run no config
// change or rollback.
type nopReleases struct{}

var errNoReleases = errors.New("this test's backend records no releases")

func (nopReleases) RecordConfig(context.Context, string, func([]appv1.EnvVar) []appv1.EnvVar, string, string, io.Writer) (int64, error) {
	return 0, errNoReleases
}
func (nopReleases) Rollback(context.Context, string, int64, string) (int64, error) {
	return 0, errNoReleases
}
func (nopReleases) List(context.Context, string) ([]appv1.Release, error) { return nil, nil }
func (nopReleases) Await(context.Context, string, int64, func(string)) (string, error) {
	return "", errNoReleases
}

// nopAdmission admits no push: for tests that never authenticate.
type nopAdmission struct{}

func (nopAdmission) AdmitPush(_ context.Context, _ *backend.User, name string) (*backend.PushTarget, error) {
	return nil, backend.Errorf(backend.Forbidden, "no push to %s here", name)
}
func (a nopAdmission) CreatePushedApp(ctx context.Context, u *backend.User, name string) (*backend.PushTarget, error) {
	return a.AdmitPush(ctx, u, name)
}
func (nopAdmission) Pushed(*backend.User, string, backend.PushDone) {}

func (nopAdmission) SetDeployBranch(context.Context, *backend.User, string, string) error {
	return backend.ErrForbidden
}

func clientScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	return s
}
