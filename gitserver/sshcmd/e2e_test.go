package sshcmd_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/gitserver/sshcmd"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/testenv"
)

// server is a real gitserver with the real access directory on the shared control
// plane, serving the commands; its users are driven with the real ssh client.
type server struct {
	t    testing.TB
	cp   *testenv.ControlPlane
	ns   string
	addr string
	dir  *access.Kube
	log  *testenv.SyncBuffer
	// b is the backend the commands run on (VerifyToken is the agents' door).
	b *backend.Backend
}

// baseDomain is the test server's: apps answer at <app>.apps.bex.test.
const baseDomain = "apps.bex.test"

// newServer's tweaks are applied to the backend's Config.
func newServer(t testing.TB, tweaks ...func(*backend.Config)) *server {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "sshcmd")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir, c, err := access.Start(ctx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cp: cp, ns: ns, dir: dir, log: &testenv.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(s.log, nil))
	state := t.TempDir()
	pcfg := pipeline.DefaultConfig()
	pcfg.StateDir = state
	pl, err := pipeline.New(pcfg, dir, noBuilds{}, noReleases{}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Reader, bcfg.Namespace = cp.Client, c, ns
	bcfg.Releases = &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	bcfg.Logs, bcfg.Builds, bcfg.Log, bcfg.RolloutTimeout = followLogs{}, fakeBuilds{}, log, 20*time.Second
	bcfg.RemoveRepository = func(ctx context.Context, app string) error { return pl.RemoveRepository(ctx, app, time.Second) }
	bcfg.BaseDomain = baseDomain
	bcfg.Tokens = &tokens.Store{Client: cp.Client, Users: c, Namespace: ns}
	for _, tweak := range tweaks {
		tweak(&bcfg)
	}
	b, err := backend.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	s.b = b
	cmds, err := sshcmd.New(sshcmd.Config{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	cfg := gitserver.DefaultConfig()
	cfg.StateDir = state
	cfg.Addr = "127.0.0.1:0"
	cfg.SessionRecheck = 200 * time.Millisecond
	srv, err := gitserver.New(cfg, dir, b, pl, log, nil, gitserver.WithCommands(cmds))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		pl.Shutdown(ctx)
		if t.Failed() {
			t.Logf("server log:\n%s", s.log.String())
		}
	})
	return s
}

// followLogs prints one line per app and, with Follow, waits for new ones that
// never come, as the runtime's logs do, until the session's context ends.
type followLogs struct{}

func (followLogs) Logs(ctx context.Context, app string, o backend.LogOptions, w io.Writer) error {
	fmt.Fprintf(w, "web.1[r1]: hello from %s\n", app)
	if o.Follow {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

type noBuilds struct{}

func (noBuilds) Build(context.Context, pipeline.BuildRequest, io.Writer) (*pipeline.BuildResult, error) {
	return nil, errors.New("no builds in this test")
}

type noReleases struct{}

func (noReleases) Release(context.Context, pipeline.ReleaseRequest) (int64, error) {
	return 0, errors.New("no deploys in this test")
}
func (noReleases) WaitRollout(context.Context, string, int64, io.Writer) (string, error) {
	return "", errors.New("no deploys in this test")
}
func (noReleases) Serving(context.Context, string) (int64, error) { return 0, nil }

// sshUser is a User on the control plane with one key, named uniquely (Users are
// cluster-scoped and the control plane is shared).
type sshUser struct {
	s    *server
	name string
	key  *testenv.SSHKey
}

func (s *server) addUser(base string, role appv1.UserRole, canCreate bool) *sshUser {
	s.t.Helper()
	u := &sshUser{s: s, name: base + "-" + s.ns, key: testenv.NewSSHKey(s.t)}
	obj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: u.name}, Spec: appv1.UserSpec{Role: role, CanCreateApps: canCreate,
		Keys: []appv1.SSHKey{{Name: "laptop", PublicKey: u.key.AuthorizedKey}}}}
	if err := s.cp.Client.Create(context.Background(), obj); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(func() error { _, err := s.dir.UserByKey(context.Background(), u.key.Signer.PublicKey()); return err })
	return u
}

func (s *server) eventually(f func() error) {
	s.t.Helper()
	testenv.Eventually(s.t, 10*time.Second, "condition", f)
}

// ssh runs the real ssh client; args are what a user types after the host, so
// they go through the client's joining and the server's splitting.
func (u *sshUser) ssh(stdin string, args ...string) (string, string, int) {
	cmd := testenv.SSHCommand(u.key, "bex", u.s.addr, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		u.s.t.Fatalf("ssh: %v", err)
	}
	return o.String(), e.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (u *sshUser) ok(stdin string, args ...string) string {
	u.s.t.Helper()
	out, errOut, code := u.ssh(stdin, args...)
	if code != 0 {
		u.s.t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

// refused runs a command that must fail with one line on stderr containing want.
func (u *sshUser) refused(want string, args ...string) {
	u.s.t.Helper()
	out, errOut, code := u.ssh("", args...)
	if code == 0 || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
		u.s.t.Errorf("%v: exit %d, stdout %q, stderr %q; want a refusal with %q", args, code, out, errOut, want)
	}
}

func (u *sshUser) json(v any, args ...string) {
	u.s.t.Helper()
	out := u.ok("", append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		u.s.t.Fatalf("%v --json: %v\n%s", args, err, out)
	}
}

func (s *server) app(name string) *appv1.App {
	s.t.Helper()
	a := &appv1.App{}
	if err := s.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: name}, a); err != nil {
		s.t.Fatal(err)
	}
	return a
}

func TestOverSSH(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := s.addUser("admin", appv1.RoleAdmin, false)

	// No command: help, exit 0.
	if out := admin.ok(""); !strings.Contains(out, "ssh bex@HOST <command>") {
		t.Fatalf("help:\n%s", out)
	}
	admin.refused(`unknown command "apps:lst": did you mean apps:list?`, "apps:lst")

	// An admin adds a member and the member's key, read from stdin.
	bobKey := testenv.NewSSHKey(t)
	bob := &sshUser{s: s, name: "bob-" + s.ns, key: bobKey}
	admin.ok("", "users:add", bob.name)
	admin.refused("exists already", "users:add", bob.name)
	fp := strings.TrimSpace(admin.ok(bobKey.AuthorizedKey+"\n", "keys:add", "laptop", "--user", bob.name))
	keygen, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", bobKey.Path).Output()
	if err != nil || !strings.Contains(string(keygen), " "+fp+" ") {
		t.Fatalf("keys:add printed %q; ssh-keygen -l says %q (%v)", fp, keygen, err)
	}
	out, errOut, code := bob.ssh("not a key\n", "keys:add", "other")
	if code == 0 || !strings.Contains(errOut, "not an OpenSSH public key") {
		t.Fatalf("invalid key text: %d %q %q", code, out, errOut)
	}
	out, errOut, code = bob.ssh(admin.key.AuthorizedKey, "keys:add", "other")
	if code == 0 || !strings.Contains(errOut, "belongs to another user") {
		t.Fatalf("another user's key: %d %q %q", code, out, errOut)
	}
	var me backend.WhoAmI
	bob.json(&me, "whoami")
	if me.Name != bob.name || me.Role != "member" || me.Fingerprint != fp || me.Key != "laptop" {
		t.Fatalf("whoami %+v", me)
	}

	// Apps: bob creates one; carol, another member, is kept out of it.
	bob.ok("", "apps:create", "shop")
	carol := s.addUser("carol", appv1.RoleMember, true)
	carol.ok("", "apps:create", "shopfront")
	carol.refused("has no access to app shop", "apps:info", "shop")
	carol.refused("has no access to app shop", "config:set", "shop", "A=1")
	bob.refused("has no access to app shopfront", "ps", "shopfront")
	var apps []backend.AppSummary
	bob.json(&apps, "apps:list")
	if len(apps) != 1 || apps[0].Name != "shop" {
		t.Fatalf("bob's apps: %+v", apps)
	}
	admin.json(&apps, "apps:list")
	if len(apps) != 2 {
		t.Fatalf("the admin's apps: %+v", apps)
	}
	bob.refused(`no app "nope"`, "apps:info", "nope")

	// Access, by exact name.
	bob.ok("", "access:add", "shop", carol.name)
	var al backend.AccessList
	carol.json(&al, "access:list", "shop")
	if len(al.Members) != 2 || al.Members[1] != carol.name {
		t.Fatalf("access:list %+v", al)
	}
	bob.ok("", "access:remove", "shop", carol.name)
	s.eventually(func() error {
		if _, errOut, code := carol.ssh("", "apps:info", "shop"); code == 0 {
			return errors.New("carol still reads shop: " + errOut)
		}
		return nil
	})

	// Config before the first deploy goes to the spec; after it, each change is a
	// release that the command waits for.
	bob.ok("", "config:set", "shop", "EARLY=1")
	a := s.app("shop")
	a.Spec.Image = "bex.local/shop@sha256:" + strings.Repeat("b", 64)
	a.Spec.Release = 0
	if err := s.cp.Client.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	testenv.StartFakeDeployer(ctx, t, s.cp.Client, s.ns)
	// The injection cases: typed as a user would, quoted for the remote side. The
	// local "shell" here is exec's argv, so each arg is what the user's shell would
	// have passed to ssh.
	cases := map[string]string{
		"SEMI":    `'a b;$(touch /tmp/pwned)'`,
		"QUOTES":  `"it's \"quoted\""`,
		"NEWLINE": "'line1\nline2'",
		"UNICODE": `'ü 😀 ✓'`,
		"BACKTK":  "'`id` && rm -rf / | cat > x'",
		"DOLLAR":  `'$HOME ${PATH} $1'`,
	}
	want := map[string]string{
		"SEMI": "a b;$(touch /tmp/pwned)", "QUOTES": `it's "quoted"`, "NEWLINE": "line1\nline2",
		"UNICODE": "ü 😀 ✓", "BACKTK": "`id` && rm -rf / | cat > x", "DOLLAR": "$HOME ${PATH} $1",
	}
	var pairs []string
	for k, v := range cases {
		pairs = append(pairs, k+"="+v)
	}
	out = bob.ok("", append([]string{"config:set", "shop"}, pairs...)...)
	if !strings.Contains(out, "release v1.") || !strings.Contains(out, "v1 serves at https://shop.localhost") {
		t.Fatalf("config:set:\n%s", out)
	}
	for k, v := range want {
		if got := bob.ok("", "config:get", "shop", k); got != v+"\n" {
			t.Errorf("config:get %s = %q, want %q", k, got, v)
		}
	}
	var cl backend.ConfigList
	bob.json(&cl, "config", "shop")
	for _, cv := range cl.Config {
		if w, ok := want[cv.Name]; ok && *cv.Value != w {
			t.Errorf("config --json %s = %q, want %q", cv.Name, *cv.Value, w)
		}
	}
	// The command's printed form can be pasted back.
	printed := bob.ok("", "config", "shop")
	for _, line := range strings.Split(strings.TrimSpace(printed), "\n") {
		if strings.HasPrefix(line, "SEMI=") {
			bob.ok("", "config:set", "shop", strings.Replace(line, "SEMI=", "SEMI2=", 1))
		}
	}
	if got := bob.ok("", "config:get", "shop", "SEMI2"); got != want["SEMI"]+"\n" {
		t.Errorf("pasted back: %q", got)
	}
	// One release for all the pairs (v1), then SEMI2 (v2).
	var rels []backend.ReleaseInfo
	bob.json(&rels, "releases", "shop")
	if len(rels) != 2 || rels[1].Number != 1 || rels[1].Cause != "Config" || rels[1].Actor != bob.name || rels[1].Description == "" || !rels[0].Serving {
		t.Fatalf("releases %+v", rels)
	}
	rel := &appv1.Release{}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "shop-v1"}, rel); err != nil {
		t.Fatal(err)
	}
	if n := len(rel.Spec.Config.Env); n != len(cases)+1 {
		t.Fatalf("release v1 has %d vars: %+v", n, rel.Spec.Config.Env)
	}
	bob.refused(`"1X" is not a config var name`, "config:set", "shop", "1X=y")
	bob.ok("", "config:unset", "shop", "SEMI2", "--detach")

	// Rollback: to the one before, by default.
	out = bob.ok("", "rollback", "shop")
	if !strings.Contains(out, "Rolled shop back to v2: release v4") {
		t.Fatalf("rollback:\n%s", out)
	}
	bob.refused("shop has no release v42", "rollback", "shop", "v42")

	// --encoded (Dokku's): base64 values, for newlines and quotes; base64(1)'s
	// wrapped lines are taken as they come.
	twoLines := "first line with 'single' and \"double\" quotes\nsecond line; $(not run)"
	enc := base64.StdEncoding.EncodeToString([]byte(twoLines))
	wrapped := enc[:20] + "\n" + enc[20:]
	bob.ok("", "config:set", "--encoded", "--detach", "shop", "ENC="+enc, "'WRAPPED="+wrapped+"'")
	for _, k := range []string{"ENC", "WRAPPED"} {
		if got := bob.ok("", "config:get", "shop", k); got != twoLines+"\n" {
			t.Errorf("config:get %s after config:set --encoded = %q, want %q", k, got, twoLines)
		}
	}
	bob.refused("the value of BAD is not base64 (--encoded)", "config:set", "--encoded", "shop", "BAD=not*base64")

	// Processes, restarts, suspension, domains.
	a = s.app("shop")
	a.Spec.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Command: []string{"./w"}}}
	if err := s.cp.Client.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	s.eventually(func() error {
		_, errOut, code := bob.ssh("", "ps:scale", "shop", "web=2", "worker=1")
		if code != 0 {
			return errors.New(errOut)
		}
		return nil
	})
	bob.refused(`shop has no process type "clock"`, "ps:scale", "shop", "clock=1")
	var ps backend.Processes
	bob.json(&ps, "ps", "shop")
	if len(ps.Processes) != 2 || ps.Processes[0].Replicas != 2 || ps.Processes[1].Replicas != 1 {
		t.Fatalf("ps %+v", ps)
	}
	bob.ok("", "ps:restart", "shop", "web")
	if s.app("shop").RestartToken("web") == "" {
		t.Fatal("ps:restart set no annotation")
	}
	bob.ok("", "suspend", "shop")
	if !s.app("shop").Spec.Suspended {
		t.Fatal("suspend")
	}
	bob.ok("", "resume", "shop")
	bob.ok("", "domains:add", "shop", "shop.example.com")
	bob.refused(`"bad domain" is not a domain name`, "domains:add", "shop", "'bad domain'")
	var dl backend.DomainList
	bob.json(&dl, "domains", "shop")
	if len(dl.Domains) != 1 || dl.Domains[0] != "shop.example.com" {
		t.Fatalf("domains %+v", dl)
	}

	// Logs and builds come through their interfaces.
	if out := bob.ok("", "logs", "shop", "-n", "5"); out != "web.1[r1]: hello from shop\n" {
		t.Fatalf("logs: %q", out)
	}
	var builds []backend.BuildInfo
	bob.json(&builds, "builds", "shop")
	if len(builds) != 2 {
		t.Fatalf("builds %+v", builds)
	}

	// A removed key is refused on its next connection.
	bob.ok("", "keys:remove", "laptop")
	s.eventually(func() error {
		if _, errOut, code := bob.ssh("", "apps:list"); code != 255 || !strings.Contains(errOut, "Permission denied") {
			return errors.New("bob's removed key still connects: " + errOut)
		}
		return nil
	})

	// Destroying takes the app away.
	admin.refused("--confirm shop", "apps:destroy", "shop")
	admin.ok("", "apps:destroy", "shop", "--confirm", "shop")
	s.eventually(func() error {
		if _, _, code := admin.ssh("", "apps:info", "shop"); code == 0 {
			return errors.New("shop is still there")
		}
		return nil
	})

	// Every change left an audit line naming who and which app.
	log := s.log.String()
	for _, w := range []string{"command=config:set backend.app=shop", "command=apps:destroy backend.app=shop", "backend.user=" + bob.name} {
		if !strings.Contains(log, w) {
			t.Errorf("the log lacks %q", w)
		}
	}
}
