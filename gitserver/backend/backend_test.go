package backend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// The backend's rules on their own, on a fake API client: who may do what,
// which kind each refusal has, and the limits every front-end gets alike.

const ns = "apps"

var (
	admin  = &backend.User{Name: "ana", Admin: true, CanCreateApps: true, KeyName: "laptop"}
	member = &backend.User{Name: "bob", CanCreateApps: true, KeyName: "desk"}
	guest  = &backend.User{Name: "carol", KeyName: "ci"}
)

// fakeReleases records what the backend asks of the release recorder.
type fakeReleases struct {
	c        client.Client
	rels     []appv1.Release
	recorded []string
	failWith string
}

func (f *fakeReleases) RecordConfig(ctx context.Context, app string, edit func([]appv1.EnvVar) []appv1.EnvVar, actor, desc string, _ io.Writer) (int64, error) {
	a := &appv1.App{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: app}, a); err != nil {
		return 0, err
	}
	a.Spec.Env = edit(a.Spec.Env)
	a.Spec.Release++
	f.recorded = append(f.recorded, actor+": "+desc)
	return a.Spec.Release, f.c.Update(ctx, a)
}

func (f *fakeReleases) Rollback(_ context.Context, app string, to int64, actor string) (int64, error) {
	f.recorded = append(f.recorded, fmt.Sprintf("%s: rollback to v%d", actor, to))
	return 99, nil
}

func (f *fakeReleases) List(context.Context, string) ([]appv1.Release, error) { return f.rels, nil }

type rolloutError struct{ reason string }

func (e rolloutError) Error() string          { return "rollout failed: " + e.reason }
func (e rolloutError) RolloutFailure() string { return e.reason }

func (f *fakeReleases) Await(_ context.Context, app string, n int64, _ func(string)) (string, error) {
	if f.failWith != "" {
		return "", fmt.Errorf("waiting: %w", rolloutError{f.failWith})
	}
	return "https://" + app + ".bex.test", nil
}

type fixture struct {
	b   *backend.Backend
	c   client.Client
	rel *fakeReleases
	log bytes.Buffer
}

func newFixture(t *testing.T, objs ...client.Object) *fixture {
	t.Helper()
	return newFixtureWith(t, nil, objs...)
}

// newFixtureWith is newFixture with tweak applied to the backend's Config.
func newFixtureWith(t *testing.T, tweak func(*backend.Config), objs ...client.Object) *fixture {
	t.Helper()
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&appv1.App{}).Build()
	f := &fixture{c: c, rel: &fakeReleases{c: c}}
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Namespace, cfg.Releases = c, ns, f.rel
	cfg.CacheWait = 2 * time.Second
	cfg.Log = slog.New(slog.NewTextHandler(&f.log, nil))
	if tweak != nil {
		tweak(&cfg)
	}
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.b = b
	return f
}

func app(name string, members ...string) *appv1.App {
	return &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appv1.AppSpec{Members: members,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}}
}

func deployed(a *appv1.App) *appv1.App {
	a.Spec.Image = "bex.local/" + a.Name + "@sha256:" + strings.Repeat("a", 64)
	a.Spec.Release = 3
	a.Status.Revision = 3
	return a
}

func release(app string, n int64, failed string) appv1.Release {
	r := appv1.Release{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-v%d", app, n), Namespace: ns}, Spec: appv1.ReleaseSpec{Number: n}}
	if failed != "" {
		r.Annotations = map[string]string{appv1.AnnotationReleaseFailed: failed}
	}
	return r
}

// wantKind fails unless err has kind k and its message contains want.
func wantKind(t *testing.T, what string, err error, k backend.Kind, want string) {
	t.Helper()
	if err == nil || backend.KindOf(err) != k || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got %v (kind %s), want kind %s with %q", what, err, backend.KindOf(err), k, want)
	}
}

func TestErrorKinds(t *testing.T) {
	err := fmt.Errorf("listing: %w", backend.Errorf(backend.Forbidden, "no access to %s", "shop"))
	if !errors.Is(err, backend.ErrForbidden) || errors.Is(err, backend.ErrNotFound) || backend.KindOf(err) != backend.Forbidden {
		t.Errorf("a wrapped Forbidden error: Is/KindOf say otherwise (%v)", err)
	}
	cause := errors.New("disk full")
	if e := backend.Errorf(backend.Failed, "build: %w", cause); !errors.Is(e, cause) || e.Error() != "build: disk full" {
		t.Errorf("Errorf keeps its %%w cause: %v", e)
	}
	if k := backend.KindOf(errors.New("plain")); k != backend.Internal || k.String() != "internal" {
		t.Errorf("a plain error is Internal: %v", k)
	}
	for k, code := range map[backend.Kind]string{backend.NotFound: "not_found", backend.Forbidden: "forbidden",
		backend.Invalid: "invalid", backend.Conflict: "conflict", backend.Failed: "failed"} {
		if k.String() != code {
			t.Errorf("%d.String() = %s, want %s", k, k.String(), code)
		}
	}
}

func TestAccessRules(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), app("secret", "carol"), &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob"}})
	ctx := context.Background()
	if _, err := f.b.App(ctx, member, "shop"); err != nil {
		t.Errorf("a member reads its app: %v", err)
	}
	if _, err := f.b.App(ctx, admin, "secret"); err != nil {
		t.Errorf("an admin reads every app: %v", err)
	}
	_, err := f.b.App(ctx, member, "secret")
	wantKind(t, "another's app", err, backend.Forbidden, "access:add secret bob")
	_, err = f.b.App(ctx, member, "nope")
	wantKind(t, "no such app", err, backend.NotFound, `no app "nope"`)
	_, err = f.b.App(ctx, member, "../etc")
	wantKind(t, "not an app name", err, backend.Invalid, "1 to 40 lower-case letters")
	_, err = f.b.App(ctx, member, strings.Repeat("a", 41))
	wantKind(t, "a name over 40", err, backend.Invalid, "is not an app name")

	// Every operation on an app goes through the same check.
	wantKind(t, "scale another's app", func() error {
		_, err := f.b.Scale(ctx, member, "secret", []string{"web"}, map[string]int32{"web": 2})
		return err
	}(), backend.Forbidden, "no access")
	wantKind(t, "suspend another's app", f.b.SetSuspended(ctx, member, "secret", true), backend.Forbidden, "no access")
	wantKind(t, "add a member to another's app", f.b.AddMember(ctx, member, "secret", "bob"), backend.Forbidden, "no access")

	apps, err := f.b.Apps(ctx, member)
	if err != nil || len(apps) != 1 || apps[0].Name != "shop" || apps[0].Phase != "Pending" {
		t.Errorf("a member lists its apps only: %+v %v", apps, err)
	}
	if apps, _ := f.b.Apps(ctx, admin); len(apps) != 2 {
		t.Errorf("an admin lists every app: %+v", apps)
	}

	wantKind(t, "a guest creates an app", f.b.CreateApp(ctx, guest, "mine"), backend.Forbidden, "may not create apps")
	wantKind(t, "an app that exists", f.b.CreateApp(ctx, member, "shop"), backend.Conflict, "exists already")
	if err := f.b.CreateApp(ctx, member, "mine"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.App(ctx, member, "mine"); err != nil {
		t.Errorf("the maker of an app is its member: %v", err)
	}
	wantKind(t, "destroy without confirming", f.b.DestroyApp(ctx, member, "mine", "min"), backend.Invalid, "--confirm mine")
	if !strings.Contains(f.log.String(), "command=apps:create backend.app=mine") || !strings.Contains(f.log.String(), "backend.user=bob") {
		t.Errorf("no audit line for apps:create:\n%s", f.log.String())
	}
}

func TestAdminOnly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.b.Users(ctx, member)
	wantKind(t, "users:list", err, backend.Forbidden, "users:list is for admins")
	_, err = f.b.AddUser(ctx, member, "eve", true, true)
	wantKind(t, "users:add", err, backend.Forbidden, "for admins")
	wantKind(t, "users:remove", f.b.RemoveUser(ctx, member, "ana"), backend.Forbidden, "for admins")
	_, err = f.b.Keys(ctx, member, "ana")
	wantKind(t, "another's keys", err, backend.Forbidden, "--user is for admins")
	_, _, err = f.b.AddKey(ctx, member, "ana", "k", strings.NewReader("ssh-ed25519 AAAA"))
	wantKind(t, "a key for another", err, backend.Forbidden, "--user is for admins")
	_, _, err = f.b.AddKey(ctx, member, "", "k", io.LimitReader(neverEnding('a'), backend.MaxKeyBytes+10))
	wantKind(t, "a key over the bound", err, backend.Invalid, "more than 16384 bytes")
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// TestConfigLimits: the bounds of a config var hold for every front-end (the
// ssh commands alone had the value's bound once).
func TestConfigLimits(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	ctx := context.Background()
	_, err := f.b.ChangeConfig(ctx, member, "shop", backend.ConfigChange{Set: []backend.EnvVar{{Name: "BIG", Value: strings.Repeat("x", appv1.MaxEnvValueBytes+1)}}})
	wantKind(t, "a value over 32 KiB", err, backend.Invalid, "at most 32768 fit")
	_, err = f.b.ChangeConfig(ctx, member, "shop", backend.ConfigChange{Set: []backend.EnvVar{{Name: "1X", Value: "v"}}})
	wantKind(t, "a name a shell refuses", err, backend.Invalid, "not a config var name")
	_, err = f.b.ChangeConfig(ctx, member, "shop", backend.ConfigChange{})
	wantKind(t, "nothing", err, backend.Invalid, "nothing to change")

	res, err := f.b.ChangeConfig(ctx, member, "shop", backend.ConfigChange{
		Set: []backend.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "A", Value: "3"}}, Unset: []string{"GONE"}})
	if err != nil || res.Release != 4 || res.Description != "Set A, B" || len(res.NotSet) != 1 || res.NotSet[0] != "GONE" {
		t.Fatalf("set A, B (A twice), unset what is not set: %+v %v", res, err)
	}
	cl, _ := f.b.Config(ctx, member, "shop")
	if len(cl.Config) != 2 || *cl.Config[0].Value != "3" || *cl.Config[1].Value != "2" {
		t.Errorf("the last value of a name given twice wins, in order: %+v", cl.Config)
	}
	if res, err := f.b.ChangeConfig(ctx, member, "shop", backend.ConfigChange{Unset: []string{"NOPE"}}); err != nil || res.Description != "" || res.Release != 0 {
		t.Errorf("unsetting only what is not set records nothing: %+v %v", res, err)
	}
	if len(f.rel.recorded) != 1 || f.rel.recorded[0] != "bob: Set A, B" {
		t.Errorf("releases recorded: %q", f.rel.recorded)
	}
	_, err = f.b.ConfigVar(ctx, member, "shop", "NOPE")
	wantKind(t, "config:get of what is not set", err, backend.NotFound, "NOPE is not set on shop")
}

func TestConfigBeforeTheFirstDeploy(t *testing.T) {
	f := newFixture(t, app("shop", "bob"))
	res, err := f.b.ChangeConfig(context.Background(), member, "shop", backend.ConfigChange{Set: []backend.EnvVar{{Name: "A", Value: "1"}}})
	if err != nil || res.Release != 0 || len(f.rel.recorded) != 0 {
		t.Fatalf("before the first deploy the spec keeps the vars, no release: %+v %v %q", res, err, f.rel.recorded)
	}
	a := &appv1.App{}
	_ = f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop"}, a)
	if len(a.Spec.Env) != 1 || a.Spec.Env[0].Value != "1" {
		t.Errorf("spec.env: %+v", a.Spec.Env)
	}
}

func TestRollbackTarget(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	ctx := context.Background()
	f.rel.rels = []appv1.Release{release("shop", 3, ""), release("shop", 2, "web.1 did not answer"), release("shop", 1, "")}
	to, n, err := f.b.Rollback(ctx, member, "shop", 0)
	if err != nil || to != 1 || n != 99 {
		t.Errorf("the newest release before the current that served is v1 (v2 failed): to %d, n %d, %v", to, n, err)
	}
	_, _, err = f.b.Rollback(ctx, member, "shop", 3)
	wantKind(t, "to the current release", err, backend.Conflict, "v3 is the current release of shop already")
	_, _, err = f.b.Rollback(ctx, member, "shop", 7)
	wantKind(t, "to a release that is not there", err, backend.NotFound, "has no release v7")
	f.rel.rels = f.rel.rels[:1]
	_, _, err = f.b.Rollback(ctx, member, "shop", 0)
	wantKind(t, "nothing before", err, backend.Invalid, "no release before v3")
}

func TestAwaitReportsARolloutFailureAsFailed(t *testing.T) {
	f := newFixture(t, deployed(app("shop", "bob")))
	f.rel.failWith = "web.1 did not answer on PORT within 60s"
	_, err := f.b.Await(context.Background(), "shop", 4, nil)
	wantKind(t, "a failed rollout", err, backend.Failed, "release v4 of shop did not roll out: web.1 did not answer on PORT within 60s; the previous release keeps serving")
}

func TestDomains(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), func() *appv1.App { a := app("zeta", "carol"); a.Spec.Domains = []string{"taken.example.com"}; return a }())
	ctx := context.Background()
	_, err := f.b.AddDomain(ctx, member, "shop", "Taken.Example.com.")
	wantKind(t, "another app's domain", err, backend.Conflict, "served by another app already")
	if strings.Contains(err.Error(), "zeta") {
		t.Errorf("the refusal names an app the user may not know of: %v", err)
	}
	_, err = f.b.AddDomain(ctx, member, "shop", "nodot")
	wantKind(t, "a name without a dot", err, backend.Invalid, "not a domain name")
	if d, err := f.b.AddDomain(ctx, member, "shop", "WWW.Shop.Example."); err != nil || d != "www.shop.example" {
		t.Errorf("a domain is kept lower case without its dot: %q %v", d, err)
	}
	_, err = f.b.AddDomain(ctx, member, "shop", "www.shop.example")
	wantKind(t, "twice", err, backend.Conflict, "serves www.shop.example already")
	_, err = f.b.RemoveDomain(ctx, member, "shop", "gone.example")
	wantKind(t, "a domain it does not serve", err, backend.NotFound, "does not serve")
}

// TestDomainsUnderPublicSuffixes: a public suffix of either kind (ICANN's
// co.uk, a private registry's github.io), or a wildcard over one, would give one
// app every site under it and, with on-demand TLS, a certificate order per name
// anyone invents: refused for admins too. A wildcard over a domain of one's own
// routes a whole subtree, so only admins add one. Ordinary names stay accepted.
func TestDomainsUnderPublicSuffixes(t *testing.T) {
	f := newFixture(t, app("shop", "bob"))
	ctx := context.Background()
	for _, d := range []string{"*.com", "co.uk", "CO.UK.", "*.co.uk", "*.github.io", "github.io", "*.example"} {
		_, err := f.b.AddDomain(ctx, admin, "shop", d)
		wantKind(t, d, err, backend.Invalid, "public suffix")
	}
	_, err := f.b.AddDomain(ctx, member, "shop", "*.shop.example")
	wantKind(t, "a member's wildcard", err, backend.Forbidden, "wildcard domains are for admins")
	_, err = f.b.AddDomain(ctx, guest, "shop", "*.shop.example")
	wantKind(t, "a wildcard on an app the user cannot use", err, backend.Forbidden, "no access")
	for _, c := range []struct {
		u    *backend.User
		d    string
		want string
	}{
		{admin, "*.shop.example", "*.shop.example"},
		{member, "www.shop.example.com", "www.shop.example.com"},
		{member, "shop.co.uk", "shop.co.uk"},       // a registered domain under a public suffix
		{member, "bob.github.io", "bob.github.io"}, // a private registry's user
	} {
		if got, err := f.b.AddDomain(ctx, c.u, "shop", c.d); err != nil || got != c.want {
			t.Errorf("%s adding %s: %q %v", c.u.Name, c.d, got, err)
		}
	}
	dl, err := f.b.Domains(ctx, member, "shop")
	if err != nil || len(dl.Domains) != 4 {
		t.Errorf("domains after the refusals: %+v %v", dl, err)
	}
}

func TestProcessRules(t *testing.T) {
	f := newFixture(t, app("shop", "bob"))
	ctx := context.Background()
	_, err := f.b.Scale(ctx, member, "shop", []string{"web"}, map[string]int32{"web": appv1.MaxReplicas + 1})
	wantKind(t, "over the replicas bound", err, backend.Invalid, "go from 0 to 100")
	_, err = f.b.Scale(ctx, member, "shop", []string{"wrker"}, map[string]int32{"wrker": 1})
	wantKind(t, "a type it has not", err, backend.Invalid, `no process type "wrker": its types are web`)
	procs, err := f.b.Scale(ctx, member, "shop", []string{"web"}, map[string]int32{"web": 3})
	if err != nil || len(procs) != 1 || procs[0].Replicas != 3 {
		t.Errorf("scale: %+v %v", procs, err)
	}
	wantKind(t, "restart a type it has not", f.b.Restart(ctx, member, "shop", "db"), backend.Invalid, `no process type "db"`)
}

func TestDeployWithoutABuilder(t *testing.T) {
	f := newFixture(t, app("shop", "bob"))
	_, err := f.b.Deploy(context.Background(), member, "shop", "")
	wantKind(t, "a server that does not build", err, backend.Invalid, "does not build")
	_, err = f.b.Deploy(context.Background(), member, "shop", "HEAD~1")
	wantKind(t, "not a commit id", err, backend.Invalid, "full 40-digit")
}

func TestHookOfAnUnknownApp(t *testing.T) {
	f := newFixture(t, app("shop", "bob"))
	if _, err := f.b.Hook(context.Background(), "nope"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("unknown app: %v", err)
	}
	h, err := f.b.Hook(context.Background(), "shop")
	if err != nil || len(h.Secrets) != 0 {
		t.Errorf("an app without a webhook secret has a hook with no secrets: %+v %v", h, err)
	}
}

// apps:destroy removes the app's repository and its build logs with it: an app
// made later under that name must not show the old one's builds.
func TestDestroyRemovesRepositoryAndBuildLogs(t *testing.T) {
	var removed []string
	f := newFixtureWith(t, func(c *backend.Config) {
		c.RemoveRepository = func(_ context.Context, app string) error { removed = append(removed, "repo:"+app); return nil }
		c.RemoveBuildLogs = func(app string) error { removed = append(removed, "logs:"+app); return nil }
	})
	ctx := context.Background()
	if err := f.b.CreateApp(ctx, member, "mine"); err != nil {
		t.Fatal(err)
	}
	if err := f.b.DestroyApp(ctx, member, "mine", "mine"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"repo:mine", "logs:mine"}; !slices.Equal(removed, want) {
		t.Errorf("destroy removed %v, want %v", removed, want)
	}
}

// TestDomainsOfThePlatformAndOfOthers: a member may add nothing of the base
// domain (with the default, localhost, and with a base under a registered
// domain: its other names are refused too), nor a name under a domain of an
// app they are not a member of (an exact domain or a wildcard); an admin may.
// A base on the public suffix list (as herokuapp.com is) refuses only names
// under itself: its neighbours cannot set cookies for it.
func TestDomainsOfThePlatformAndOfOthers(t *testing.T) {
	zeta := app("zeta", "carol")
	zeta.Spec.Domains = []string{"zeta.example.org", "*.wild.example.org"}
	ctx := context.Background()
	for _, c := range []struct {
		base    string
		refused []string
		kind    backend.Kind
		ok      []string
	}{
		{"localhost", []string{"shop.localhost", "login.zeta.localhost", "a.b.localhost"}, backend.Forbidden, []string{"www.shop.example"}},
		{"apps.example.com", []string{"apps.example.com", "zeta.apps.example.com", "login.zeta.apps.example.com", "example.com", "www.example.com", "a.b.example.com"},
			backend.Forbidden, []string{"www.example.net", "example.com.evil.example"}},
		{"herokuapp.com", []string{"zeta.herokuapp.com", "login.zeta.herokuapp.com"}, backend.Forbidden, []string{"www.example.com"}},
		{"", nil, backend.Forbidden, []string{"zeta.localhost"}},
	} {
		f := newFixtureWith(t, func(cfg *backend.Config) { cfg.BaseDomain = c.base }, app("shop", "bob"), zeta.DeepCopy())
		for _, d := range c.refused {
			_, err := f.b.AddDomain(ctx, member, "shop", d)
			wantKind(t, c.base+": "+d, err, c.kind, "ask an admin")
			if d, err := f.b.AddDomain(ctx, admin, "shop", d); err != nil {
				t.Errorf("base %q: an admin adds %s: %v", c.base, d, err)
			}
		}
		for _, d := range c.ok {
			if _, err := f.b.AddDomain(ctx, member, "shop", d); err != nil {
				t.Errorf("base %q: a member adds %s: %v", c.base, d, err)
			}
		}
		for _, d := range []string{"login.zeta.example.org", "a.b.zeta.example.org", "x.wild.example.org"} {
			_, err := f.b.AddDomain(ctx, member, "shop", d)
			wantKind(t, d, err, backend.Forbidden, "a domain of another app: only its members (or an admin) may add names under it")
		}
		// zeta.example.org itself is taken; a name beside it is not under it.
		if _, err := f.b.AddDomain(ctx, member, "shop", "notzeta.example.org"); err != nil {
			t.Errorf("base %q: a name beside another app's domain: %v", c.base, err)
		}
	}
}
