package sshcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/sshcmd"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const ns = "apps"

// fixture is the command tree on a fake API client, with buffers for its streams.
type fixture struct {
	t    *testing.T
	c    client.Client
	cmds *sshcmd.Commands
	b    *backend.Backend
	log  bytes.Buffer
	logs *fakeLogs
	// fp is the fingerprint of the key the sessions of run are signed in with.
	fp string
}

var (
	// UIDs as user() gives the User objects (the fake client gives none).
	ana   = &backend.User{Name: "ana", UID: "uid-ana", Admin: true, KeyName: "laptop"}
	bob   = &backend.User{Name: "bob", UID: "uid-bob", CanCreateApps: true, KeyName: "desk"}
	carol = &backend.User{Name: "carol", UID: "uid-carol", KeyName: "ci"}
)

func newFixture(t *testing.T, objs ...client.Object) *fixture {
	t.Helper()
	return newFixtureWith(t, nil, objs...)
}

// newFixtureWith is newFixture with a change of the backend's Config.
func newFixtureWith(t *testing.T, tweak func(*backend.Config), objs ...client.Object) *fixture {
	t.Helper()
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&appv1.App{}).Build()
	f := &fixture{t: t, c: c, logs: &fakeLogs{}, fp: "SHA256:test"}
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Namespace = c, ns
	cfg.Releases = &releases.Recorder{Client: c, Namespace: ns, PollInterval: 10 * time.Millisecond}
	cfg.Logs, cfg.Builds, cfg.RolloutTimeout, cfg.Host = f.logs, fakeBuilds{}, 2*time.Second, "ssh://git@bex.test:2222"
	cfg.Log = slog.New(slog.NewTextHandler(&f.log, nil))
	if tweak != nil {
		tweak(&cfg)
	}
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := sshcmd.New(sshcmd.Config{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	f.cmds, f.b = cmds, b
	return f
}

func (f *fixture) run(u *backend.User, stdin string, args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := f.cmds.Run(context.Background(), gitserver.CommandSession{User: u, KeyFingerprint: f.fp, Args: args,
		Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut})
	return out.String(), errOut.String(), code
}

func (f *fixture) app(name string) *appv1.App {
	f.t.Helper()
	a := &appv1.App{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
		f.t.Fatal(err)
	}
	return a
}

func app(name string, members ...string) *appv1.App {
	return &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appv1.AppSpec{Members: members,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Command: []string{"./work", "--hard"}}}}}
}

func deployed(a *appv1.App) *appv1.App {
	a.Spec.Image = "bex.local/" + a.Name + "@sha256:" + strings.Repeat("a", 64)
	return a
}

func user(name string, role appv1.UserRole, keys ...string) *appv1.User {
	u := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}, Spec: appv1.UserSpec{Role: role}}
	for i, k := range keys {
		u.Spec.Keys = append(u.Spec.Keys, appv1.SSHKey{Name: fmt.Sprintf("k%d", i), PublicKey: k})
	}
	return u
}

type fakeLogs struct{ got backend.LogOptions }

func (l *fakeLogs) Logs(_ context.Context, app string, o backend.LogOptions, w io.Writer) error {
	l.got = o
	fmt.Fprintf(w, "web.1[r1]: hello from %s\n", app)
	return nil
}

type fakeBuilds struct{}

func (fakeBuilds) List(app string) ([]backend.BuildInfo, error) {
	return []backend.BuildInfo{{ID: "2-bbb", Commit: "bbb", Time: time.Unix(2, 0)}, {ID: "1-aaa", Commit: "aaa", Time: time.Unix(1, 0)}}, nil
}

func (fakeBuilds) Open(app, id string) (io.ReadCloser, error) {
	if id != "1-aaa" && id != "2-bbb" {
		return nil, fs.ErrNotExist
	}
	return io.NopCloser(strings.NewReader("build " + id + " of " + app + "\n")), nil
}

// TestRefusals: each refusal is one line on stderr, naming what to do, and a
// non-zero exit.
func TestRefusals(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), app("foobar", "bob"), app("secret", "carol"), user("bob", appv1.RoleMember), user("carol", appv1.RoleMember))
	for _, tc := range []struct {
		user *backend.User
		args []string
		want string
	}{
		{bob, []string{"apps:lst"}, `unknown command "apps:lst": did you mean apps:list?`},
		{bob, []string{"frobnicate"}, `unknown command "frobnicate": run "help"`},
		{bob, []string{"apps:info", "nope"}, `no app "nope": apps:list shows`},
		{bob, []string{"apps:info", "Bad_Name"}, `"Bad_Name" is not an app name`},
		{bob, []string{"apps:info", "secret"}, "user bob has no access to app secret"},
		{bob, []string{"apps:info"}, "usage: apps:info APP"},
		{bob, []string{"apps:list", "--frob"}, "unknown flag: --frob"},
		{carol, []string{"apps:create", "mine"}, "user carol may not create apps"},
		{bob, []string{"apps:create", "shop"}, "app shop exists already"},
		{bob, []string{"apps:destroy", "shop"}, "run apps:destroy shop --confirm shop"},
		{bob, []string{"apps:destroy", "shop", "--confirm", "shop2"}, "run apps:destroy shop --confirm shop"},
		{bob, []string{"config:set", "shop", "NOEQUALS"}, `"NOEQUALS" is not KEY=VALUE`},
		{bob, []string{"config:set", "shop", "1BAD=x"}, `"1BAD" is not a config var name`},
		{bob, []string{"config:set", "shop", "A-B=x"}, `"A-B" is not a config var name`},
		{bob, []string{"config:get", "shop", "MISSING"}, "MISSING is not set on shop"},
		{bob, []string{"ps:scale", "shop", "clock=1"}, `shop has no process type "clock": its types are web, worker`},
		{bob, []string{"ps:scale", "shop", "web=many"}, `"web=many" is not TYPE=N`},
		{bob, []string{"ps:scale", "shop", "web=101"}, `"web=101" is not TYPE=N`},
		{bob, []string{"ps:restart", "shop", "clock"}, `no process type "clock"`},
		{bob, []string{"ps:resources", "shop", "clock", "--memory", "1Gi"}, `shop has no process type "clock": its types are web, worker`},
		{bob, []string{"ps:resources", "shop", "web", "--memory", "lots"}, `--memory "lots" is not a size: use e.g. 256Mi, 1Gi`},
		{bob, []string{"ps:resources", "shop", "web", "--memory", "1Mi"}, "memory 1Mi: the limit of an instance goes from 16Mi to 64Gi"},
		{bob, []string{"ps:resources", "shop", "web", "--cpu", "1000"}, "cpu 1k: the CPUs of an instance go from 10m"},
		{bob, []string{"ps:resources", "shop", "web", "--cpu", "two"}, `--cpu "two" is not a number of CPUs`},
		{bob, []string{"ps:resources", "secret", "web", "--cpu", "1"}, "user bob has no access to app secret"},
		{bob, []string{"rollback", "shop", "v9"}, "shop has no release v9 to roll back to"},
		{bob, []string{"rollback", "shop", "nine"}, `"nine" is not a release`},
		{bob, []string{"rollback", "shop"}, "shop has no release before v0"},
		{bob, []string{"domains:add", "shop", "not a domain"}, `"not a domain" is not a domain name`},
		{bob, []string{"domains:add", "shop", "localhost"}, `"localhost" is not a domain name`},
		{bob, []string{"domains:add", "shop", "*.com"}, "*.com is a wildcard over the public suffix com"},
		{bob, []string{"domains:add", "shop", "co.uk"}, "co.uk is a public suffix"},
		{bob, []string{"domains:add", "shop", "*.shop.example"}, "wildcard domains are for admins"},
		{bob, []string{"domains:remove", "shop", "x.example.com"}, "shop does not serve"},
		{bob, []string{"access:add", "shop", "nobody"}, `no user "nobody"`},
		{bob, []string{"access:add", "shop", "bob"}, "bob has access to shop already"},
		{bob, []string{"access:remove", "shop", "carol"}, "carol is not a member of shop"},
		{bob, []string{"users:add", "dave"}, "users:add is for admins"},
		{bob, []string{"users:list"}, "users:list is for admins"},
		{bob, []string{"keys:list", "--user", "carol"}, "--user is for admins"},
		{bob, []string{"keys:add", "k"}, "no key on stdin"},
		{ana, []string{"users:add", "Dave"}, `"Dave" is not a valid user name`},
		{ana, []string{"users:add", "bob"}, "user bob exists already"},
		{bob, []string{"logs", "shop", "--process", "clock"}, `no process type "clock"`},
		{bob, []string{"builds:logs", "shop", "9-zzz"}, `shop has no build "9-zzz"`},
		{bob, []string{"config:set", "shop", `"unclosed`}, ""}, // quoting is the gitserver's; here it is data
	} {
		out, errOut, code := f.run(tc.user, "", tc.args...)
		if tc.want == "" {
			continue
		}
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "bex: ") {
			t.Errorf("%s %q: exit %d, stdout %q, stderr %q; want one line with %q", tc.user.Name, tc.args, code, out, errOut, tc.want)
		}
	}
	// The Deis bug: access to foobar must not grant foo.
	f2 := newFixture(t, app("foo"), app("foobar", "bob"), app("fo"))
	if _, errOut, code := f2.run(bob, "", "apps:info", "foo"); code == 0 || !strings.Contains(errOut, "no access to app foo") {
		t.Errorf("member of foobar reading foo: %d %q", code, errOut)
	}
	out, _, _ := f2.run(bob, "", "apps:list")
	if strings.Contains(out, "foo ") || strings.Contains(out, "fo ") || !strings.Contains(out, "foobar") {
		t.Errorf("apps:list of a member of foobar:\n%s", out)
	}
}

func TestHelp(t *testing.T) {
	f := newFixture(t)
	out, _, code := f.run(bob, "")
	if code != 0 || !strings.Contains(out, "ssh bex@HOST <command>") || !strings.Contains(out, "config:set") || !strings.Contains(out, "Access, keys and users:") {
		t.Fatalf("help: %d\n%s", code, out)
	}
	if out, _, code := f.run(bob, "", "config:set", "--help"); code != 0 || !strings.Contains(out, "--detach") {
		t.Fatalf("config:set --help: %d\n%s", code, out)
	}
	if out, _, code := f.run(bob, "", "help", "ps:scale"); code != 0 || !strings.Contains(out, "ps:scale APP TYPE=N") {
		t.Fatalf("help ps:scale: %d\n%s", code, out)
	}
}

func TestAppsAndAccess(t *testing.T) {
	f := newFixture(t, user("bob", appv1.RoleMember), user("carol", appv1.RoleMember), app("other", "carol"))
	if out, _, code := f.run(bob, "", "apps:create", "shop"); code != 0 || !strings.Contains(out, "git remote add bex ssh://git@bex.test:2222/shop") {
		t.Fatalf("apps:create: %d %q", code, out)
	}
	if m := f.app("shop").Spec.Members; len(m) != 1 || m[0] != "bob" {
		t.Fatalf("members %v", m)
	}
	out, _, _ := f.run(bob, "", "apps:list", "--json")
	var apps []backend.AppSummary
	if err := json.Unmarshal([]byte(out), &apps); err != nil || len(apps) != 1 || apps[0].Name != "shop" || apps[0].Phase != "Pending" {
		t.Fatalf("apps:list --json: %v %s", err, out)
	}
	out, _, _ = f.run(ana, "", "apps", "--json")
	if err := json.Unmarshal([]byte(out), &apps); err != nil || len(apps) != 2 {
		t.Fatalf("an admin's apps: %v %s", err, out)
	}
	if _, _, code := f.run(bob, "", "access:add", "shop", "carol"); code != 0 {
		t.Fatal("access:add")
	}
	out, _, _ = f.run(carol, "", "access:list", "shop", "--json")
	var al backend.AccessList
	if err := json.Unmarshal([]byte(out), &al); err != nil || strings.Join(al.Members, ",") != "bob,carol" {
		t.Fatalf("access:list: %v %s", err, out)
	}
	if _, _, code := f.run(carol, "", "access:remove", "shop", "bob"); code != 0 {
		t.Fatal("access:remove")
	}
	if _, errOut, code := f.run(bob, "", "apps:info", "shop"); code == 0 || !strings.Contains(errOut, "no access") {
		t.Fatalf("bob after removal: %d %q", code, errOut)
	}
	if out, _, code := f.run(carol, "", "apps:destroy", "shop", "--confirm", "shop"); code != 0 || !strings.Contains(out, "Destroyed shop") {
		t.Fatalf("apps:destroy: %d %q", code, out)
	}
	if !strings.Contains(f.log.String(), "msg=audit") || !strings.Contains(f.log.String(), "backend.command=apps:destroy backend.app=shop") {
		t.Fatalf("audit log:\n%s", f.log.String())
	}
}

func TestConfig(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	weird := "a b;$(x) `y` 'q' \"d\"\nline2 ü 😀"
	out, errOut, code := f.run(bob, "", "config:set", "shop", "K="+weird, "EMPTY=", "EQ=a=b", "--detach")
	if code != 0 || !strings.Contains(out, "Set K, EMPTY, EQ on shop: release v1.") {
		t.Fatalf("config:set: %d %q %q", code, out, errOut)
	}
	rel := &appv1.Release{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop-v1"}, rel); err != nil {
		t.Fatal(err)
	}
	if rel.Spec.Cause != appv1.ReleaseCauseConfig || rel.Spec.Actor != "bob" || len(rel.Spec.Config.Env) != 3 || rel.Spec.Config.Env[0].Value != weird {
		t.Fatalf("release %+v", rel.Spec)
	}
	if out, _, _ := f.run(bob, "", "config:get", "shop", "K"); out != weird+"\n" {
		t.Fatalf("config:get = %q", out)
	}
	out, _, _ = f.run(bob, "", "config", "shop", "--json")
	var cl backend.ConfigList
	if err := json.Unmarshal([]byte(out), &cl); err != nil || *cl.Config[0].Value != weird || *cl.Config[1].Value != "" || *cl.Config[2].Value != "a=b" {
		t.Fatalf("config --json: %v %s", err, out)
	}
	out, _, _ = f.run(bob, "", "config", "shop")
	if !strings.Contains(out, `K='a b;$(x) `+"`y`"+` '\''q'\'' "d"`) || !strings.Contains(out, "EMPTY=''\nEQ=a=b\n") {
		t.Fatalf("config:\n%s", out)
	}
	// Unset: one release; unknown names are said and skipped.
	out, errOut, code = f.run(bob, "", "config:unset", "shop", "EMPTY", "NOPE", "--detach")
	if code != 0 || !strings.Contains(out, "release v2") || !strings.Contains(errOut, "NOPE is not set") {
		t.Fatalf("config:unset: %d %q %q", code, out, errOut)
	}
	if env := f.app("shop").Spec.Env; len(env) != 2 || env[1].Name != "EQ" {
		t.Fatalf("env after unset: %+v", env)
	}

	// Waiting: the rollout fails, the command says so and exits 1.
	a := f.app("shop")
	a.Status.Conditions = []metav1.Condition{{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: appv1.HealthCheckFailedReason, Message: "web.1 never answered on /healthz", LastTransitionTime: metav1.Now()}}
	a.Status.ObservedGeneration = a.Generation + 10
	if err := f.c.Status().Update(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = f.run(bob, "", "config:set", "shop", "X=1")
	if code != 1 || !strings.Contains(errOut, "release v3 of shop did not roll out: web.1 never answered on /healthz; the previous release keeps serving") {
		t.Fatalf("failed rollout: %d %q", code, errOut)
	}

	// Before the first deploy: written to the spec, no release.
	f2 := newFixture(t, app("fresh", "bob"))
	if out, _, code := f2.run(bob, "", "config:set", "fresh", "A=1"); code != 0 || !strings.Contains(out, "the first deploy") {
		t.Fatalf("config:set before a deploy: %d %q", code, out)
	}
	if env := f2.app("fresh").Spec.Env; len(env) != 1 || env[0].Value != "1" {
		t.Fatalf("env %+v", env)
	}
}

func TestScaleRestartSuspendDomains(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")), app("other", "carol"))
	if out, _, code := f.run(bob, "", "ps:scale", "shop", "web=3", "worker=2"); code != 0 || !strings.Contains(out, "web=3, worker=2") {
		t.Fatalf("ps:scale: %d %q", code, out)
	}
	a := f.app("shop")
	if a.Spec.Processes["web"].Replicas != 3 || a.Spec.Processes["worker"].Replicas != 2 || a.Spec.Processes["worker"].Command[1] != "--hard" || a.Spec.Release != 0 {
		t.Fatalf("processes %+v, release %d", a.Spec.Processes, a.Spec.Release)
	}
	if _, _, code := f.run(bob, "", "ps:restart", "shop", "worker"); code != 0 {
		t.Fatal("ps:restart worker")
	}
	a = f.app("shop")
	if a.RestartToken("worker") == "" || a.RestartToken("web") != "" {
		t.Fatalf("restart tokens: web %q, worker %q", a.RestartToken("web"), a.RestartToken("worker"))
	}
	before := a.RestartToken("worker")
	// A restart token is the time of the restart: not a wait for an event, a
	// later nanosecond for the next token to be later.
	time.Sleep(time.Millisecond)
	f.run(bob, "", "ps:restart", "shop")
	a = f.app("shop")
	if a.RestartToken("web") == "" || a.RestartToken("worker") == before {
		t.Fatal("ps:restart of the app changed no token")
	}
	out, _, _ := f.run(bob, "", "ps", "shop", "--json")
	var ps backend.Processes
	if err := json.Unmarshal([]byte(out), &ps); err != nil || len(ps.Processes) != 2 || ps.Processes[0].Type != "web" || ps.Processes[0].Replicas != 3 || ps.Processes[1].RestartedAt == "" {
		t.Fatalf("ps --json: %v %s", err, out)
	}
	f.run(bob, "", "suspend", "shop")
	if !f.app("shop").Spec.Suspended {
		t.Fatal("not suspended")
	}
	f.run(bob, "", "resume", "shop")
	if f.app("shop").Spec.Suspended {
		t.Fatal("not resumed")
	}
	if _, errOut, code := f.run(bob, "", "domains:add", "shop", "WWW.Example.com."); code != 0 {
		t.Fatalf("domains:add: %q", errOut)
	}
	if _, errOut, code := f.run(carol, "", "domains:add", "other", "www.example.com"); code == 0 || !strings.Contains(errOut, "served by another app") {
		t.Fatalf("a domain of another app: %d %q", code, errOut)
	}
	out, _, _ = f.run(bob, "", "domains", "shop", "--json")
	var dl backend.DomainList
	if err := json.Unmarshal([]byte(out), &dl); err != nil || len(dl.Domains) != 1 || dl.Domains[0] != "www.example.com" {
		t.Fatalf("domains --json: %v %s", err, out)
	}
	if _, _, code := f.run(bob, "", "domains:remove", "shop", "www.example.com"); code != 0 || len(f.app("shop").Spec.Domains) != 0 {
		t.Fatal("domains:remove")
	}
}

func TestResources(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	out, errOut, code := f.run(bob, "", "ps:resources", "shop", "web", "--memory", "1Gi", "--cpu", "2")
	if code != 0 || out != "Set web of shop to 1Gi, 2 CPU: its instances are replaced, the new ones ready before the old stop.\n" {
		t.Fatalf("ps:resources: %d %q %q", code, out, errOut)
	}
	if !strings.Contains(f.log.String(), `backend.command=ps:resources backend.app=shop backend.type=web backend.resources="memory 1Gi cpu 2"`) {
		t.Fatalf("audit log:\n%s", f.log.String())
	}
	a := f.app("shop")
	r := a.Spec.Processes["web"].Resources
	if r == nil || r.Memory.String() != "1Gi" || r.CPU.String() != "2" || a.Spec.Release != 0 || a.Spec.Processes["worker"].Resources != nil {
		t.Fatalf("processes %+v, release %d", a.Spec.Processes, a.Spec.Release)
	}
	// Only what is given changes; "none" and "default" go back.
	f.run(bob, "", "ps:resources", "shop", "web", "--cpu", "none")
	if r := f.app("shop").Spec.Processes["web"].Resources; r == nil || r.CPU != nil || r.Memory.String() != "1Gi" {
		t.Fatalf("after --cpu none: %+v", r)
	}
	out, _, _ = f.run(bob, "", "ps:resources", "shop", "web", "--json")
	var pr backend.ProcessResources
	if err := json.Unmarshal([]byte(out), &pr); err != nil || pr.Resources.Memory != "1Gi" || pr.Resources.MemoryBytes != 1<<30 || pr.Resources.CPU != "" || pr.Resources.Default {
		t.Fatalf("ps:resources --json: %v %s", err, out)
	}
	f.run(bob, "", "ps:resources", "shop", "web", "--memory", "default")
	if r := f.app("shop").Spec.Processes["web"].Resources; r != nil {
		t.Fatalf("after --memory default: %+v", r)
	}
	out, _, _ = f.run(bob, "", "ps:resources", "shop", "worker")
	if out != "Each worker instance of shop may use 512Mi, no CPU cap.\n" {
		t.Fatalf("ps:resources shop worker: %q", out)
	}
	f.run(bob, "", "ps:resources", "shop", "worker", "--memory", "256Mi")
	out, _, _ = f.run(bob, "", "ps", "shop", "--json")
	var ps backend.Processes
	if err := json.Unmarshal([]byte(out), &ps); err != nil || len(ps.Processes) != 2 || ps.Processes[0].Resources.Memory != "512Mi" || !ps.Processes[0].Resources.Default ||
		ps.Processes[1].Resources.Memory != "256Mi" || ps.Processes[1].Resources.MemoryBytes != 256<<20 {
		t.Fatalf("ps --json: %v %s", err, out)
	}
	out, _, _ = f.run(bob, "", "ps", "shop")
	if !strings.Contains(out, "MEMORY") || !regexp.MustCompile(`worker\s+\d+\s+256Mi\s+-`).MatchString(out) {
		t.Fatalf("ps:\n%s", out)
	}
	out, _, _ = f.run(bob, "", "apps:info", "shop", "--json")
	var info backend.AppInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Processes[1].Resources.Memory != "256Mi" {
		t.Fatalf("apps:info --json: %v %s", err, out)
	}

	// An OOM kill in the App's status shows in ps.
	a = f.app("shop")
	a.Status.Conditions = []metav1.Condition{{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: appv1.OOMKilledReason,
		Message: "web.1 ran out of memory (limit 512 MiB) and was killed; it is being restarted.", LastTransitionTime: metav1.Now()}}
	if err := f.c.Status().Update(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	out, _, _ = f.run(bob, "", "ps", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &ps); err != nil || ps.Trouble != appv1.OOMKilledReason || !strings.Contains(ps.TroubleMessage, "ran out of memory") {
		t.Fatalf("ps --json after an OOM kill: %v %s", err, out)
	}
	if out, _, _ := f.run(bob, "", "ps", "shop"); !strings.HasPrefix(out, "OOMKilled: web.1 ran out of memory") {
		t.Fatalf("ps:\n%s", out)
	}
}

func TestReleasesAndRollback(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	ctx := context.Background()
	rec := &releases.Recorder{Client: f.c, Namespace: ns}
	img := func(c string) string { return "bex.local/shop@sha256:" + strings.Repeat(c, 64) }
	for _, c := range []string{"1", "2", "3"} {
		if _, err := rec.Record(ctx, "shop", releases.Change{Image: img(c), Cause: appv1.ReleaseCausePush, Actor: "bob"}); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := f.run(bob, "", "rollback", "shop", "--detach")
	if code != 0 || !strings.Contains(out, "Rolled shop back to v2: release v4.") {
		t.Fatalf("rollback: %d %q %q", code, out, errOut)
	}
	if a := f.app("shop"); a.Spec.Image != img("2") || a.Spec.Release != 4 {
		t.Fatalf("after rollback: %s v%d", a.Spec.Image, a.Spec.Release)
	}
	if _, _, code := f.run(bob, "", "rollback", "shop", "v1", "--detach"); code != 0 || f.app("shop").Spec.Image != img("1") {
		t.Fatal("rollback v1")
	}
	out, _, _ = f.run(bob, "", "releases", "shop", "--json")
	var rels []backend.ReleaseInfo
	if err := json.Unmarshal([]byte(out), &rels); err != nil || len(rels) != 5 || rels[0].Number != 5 || rels[0].RollbackOf != 1 || !rels[0].Current || rels[0].Cause != "Rollback" || rels[0].Actor != "bob" {
		t.Fatalf("releases --json: %v %s", err, out)
	}
}

func TestKeysAndUsers(t *testing.T) {
	adminKey, adminLine := newKey(t)
	_, otherLine := newKey(t)
	f := newFixture(t, user("ana", appv1.RoleAdmin, adminLine), user("bob", appv1.RoleMember), app("shop", "bob"))
	out, errOut, code := f.run(bob, otherLine+"\n", "keys:add", "laptop")
	_, pk := parse(t, otherLine)
	if code != 0 || out != gossh.FingerprintSHA256(pk)+"\n" {
		t.Fatalf("keys:add: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := f.run(bob, otherLine, "keys:add", "again"); code == 0 || !strings.Contains(errOut, "is already your key") {
		t.Fatalf("the same key twice: %d %q", code, errOut)
	}
	if _, errOut, code := f.run(bob, adminLine, "keys:add", "stolen"); code == 0 || !strings.Contains(errOut, "belongs to another user") {
		t.Fatalf("another user's key: %d %q", code, errOut)
	}
	_, third := newKey(t)
	if _, errOut, code := f.run(bob, third, "keys:add", "laptop"); code == 0 || !strings.Contains(errOut, `bob has a key named "laptop" already`) {
		t.Fatalf("a duplicate key name: %d %q", code, errOut)
	}
	if _, errOut, code := f.run(bob, "ssh-ed25519 AAAAnotbase64", "keys:add", "bad"); code == 0 || !strings.Contains(errOut, "not an OpenSSH public key") {
		t.Fatalf("invalid key text: %d %q", code, errOut)
	}
	out, _, _ = f.run(bob, "", "keys:list", "--json")
	var keys []backend.KeyInfo
	if err := json.Unmarshal([]byte(out), &keys); err != nil || len(keys) != 1 || keys[0].Name != "laptop" || keys[0].Type != "ssh-ed25519" || keys[0].Comment != "test@bex" {
		t.Fatalf("keys:list --json: %v %s", err, out)
	}
	if _, _, code := f.run(bob, "", "keys:remove", keys[0].Fingerprint); code != 0 {
		t.Fatal("keys:remove by fingerprint")
	}
	// The last admin key cannot go.
	anaSession := &backend.User{Name: "ana", Admin: true, KeyName: "k0"}
	if _, errOut, code := f.run(anaSession, "", "keys:remove", "k0"); code == 0 || !strings.Contains(errOut, `"k0" is the last admin key`) {
		t.Fatalf("removing the last admin key: %d %q", code, errOut)
	}
	if _, errOut, code := f.run(anaSession, "", "users:remove", "ana"); code == 0 || !strings.Contains(errOut, "ana is the last admin") {
		t.Fatalf("removing the last admin: %d %q", code, errOut)
	}
	// Admins manage users and their keys.
	if out, _, code := f.run(anaSession, "", "users:add", "dave", "--admin"); code != 0 || !strings.Contains(out, "Created admin dave") {
		t.Fatalf("users:add: %d %q", code, out)
	}
	if _, errOut, code := f.run(anaSession, third, "keys:add", "main", "--user", "dave"); code != 0 {
		t.Fatalf("keys:add --user: %q", errOut)
	}
	if _, errOut, code := f.run(anaSession, "", "keys:remove", "k0"); code != 0 {
		t.Fatalf("removing an admin key while another admin has one: %q", errOut)
	}
	out, _, _ = f.run(anaSession, "", "users:list", "--json")
	var users []backend.UserInfo
	if err := json.Unmarshal([]byte(out), &users); err != nil || len(users) != 3 || users[2].Name != "dave" || users[2].Role != "admin" || users[2].Keys != 1 {
		t.Fatalf("users:list --json: %v %s", err, out)
	}
	// Removing a user takes them out of every app's members.
	if _, errOut, code := f.run(anaSession, "", "users:remove", "bob"); code != 0 {
		t.Fatalf("users:remove: %q", errOut)
	}
	if m := f.app("shop").Spec.Members; len(m) != 0 {
		t.Fatalf("members after users:remove: %v", m)
	}
	_ = adminKey
}

func TestLogsAndBuilds(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	out, _, code := f.run(bob, "", "logs", "shop", "-f", "-n", "5", "--process", "web")
	if code != 0 || out != "web.1[r1]: hello from shop\n" || f.logs.got != (backend.LogOptions{Follow: true, Lines: 5, Process: "web"}) {
		t.Fatalf("logs: %d %q %+v", code, out, f.logs.got)
	}
	out, _, _ = f.run(bob, "", "builds", "shop", "--json")
	var builds []backend.BuildInfo
	if err := json.Unmarshal([]byte(out), &builds); err != nil || len(builds) != 2 || builds[0].ID != "2-bbb" {
		t.Fatalf("builds --json: %v %s", err, out)
	}
	if out, _, _ := f.run(bob, "", "builds:logs", "shop"); out != "build 2-bbb of shop\n" {
		t.Fatalf("builds:logs = %q", out)
	}
	if out, _, _ := f.run(bob, "", "builds:logs", "shop", "1-aaa"); out != "build 1-aaa of shop\n" {
		t.Fatalf("builds:logs 1-aaa = %q", out)
	}
}

// Two config changes at once both land: each edits the config vars of the App as
// read for its own write, not of an older read.
func TestConcurrentConfigChangesBothLand(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errOut, code := f.run(bob, "", "config:set", "shop", fmt.Sprintf("K%d=%d", i, i), "--detach"); code != 0 {
				t.Errorf("config:set K%d: %s", i, errOut)
			}
		}()
	}
	wg.Wait()
	if env := f.app("shop").Spec.Env; len(env) != 8 {
		t.Fatalf("after 8 concurrent config:set: %+v", env)
	}
}
