package backend_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// A push's admission: who may push, and the app its first push makes.

func TestAdmitPush(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), deployedBranch(app("site", "bob"), "prod"), app("secret", "carol"))
	ctx := context.Background()

	got, err := f.b.AdmitPush(ctx, member, "site")
	if err != nil || *got != (backend.PushTarget{Name: "site", DeployBranch: "prod", Exists: true}) {
		t.Errorf("a member pushes to its app: %+v, %v", got, err)
	}
	if got, err := f.b.AdmitPush(ctx, admin, "secret"); err != nil || !got.Exists {
		t.Errorf("an admin pushes to every app: %+v, %v", got, err)
	}
	_, err = f.b.AdmitPush(ctx, member, "secret")
	wantKind(t, "a stranger's push", err, backend.Forbidden, "user bob has no access to app secret: ask an admin to add you to its members")

	// A missing app: its first push makes it, when the pusher may create apps.
	for _, u := range []*backend.User{admin, member} {
		got, err := f.b.AdmitPush(ctx, u, "fresh")
		if err != nil || *got != (backend.PushTarget{Name: "fresh"}) {
			t.Errorf("%s pushes a new app: %+v, %v", u.Name, got, err)
		}
	}
	_, err = f.b.AdmitPush(ctx, guest, "fresh")
	wantKind(t, "a guest's push of a new app", err, backend.Forbidden, "app fresh does not exist, and user carol may not create apps: ask an admin to create it")
	_, err = f.b.AdmitPush(ctx, member, "../etc")
	wantKind(t, "not an app name", err, backend.Invalid, "is not an app name")
}

func TestCreatePushedApp(t *testing.T) {
	f := newFixture(t, app("theirs", "dave"), deployedBranch(app("shared", "dave", "bob"), "prod"))
	ctx := context.Background()

	got, err := f.b.CreatePushedApp(ctx, member, "fresh")
	if err != nil || *got != (backend.PushTarget{Name: "fresh", Exists: true}) {
		t.Fatalf("the first push makes its app: %+v, %v", got, err)
	}
	var stored appv1.App
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fresh"}, &stored); err != nil || !slices.Equal(stored.Spec.Members, []string{"bob"}) {
		t.Fatalf("the pusher is the new app's member: %v %v", stored.Spec.Members, err)
	}
	if !strings.Contains(f.log.String(), `command="git push" backend.app=fresh`) || !strings.Contains(f.log.String(), "backend.user=bob") {
		t.Errorf("no audit line for the app a push made:\n%s", f.log.String())
	}

	// Another push or apps:create made it meanwhile: access is checked on it.
	_, err = f.b.CreatePushedApp(ctx, member, "theirs")
	wantKind(t, "an app another made meanwhile", err, backend.Forbidden, "user bob has no access to app theirs")
	got, err = f.b.CreatePushedApp(ctx, member, "shared")
	if err != nil || *got != (backend.PushTarget{Name: "shared", DeployBranch: "prod", Exists: true}) {
		t.Errorf("an app made meanwhile that the pusher may use: %+v, %v", got, err)
	}
	if got, err := f.b.CreatePushedApp(ctx, admin, "theirs"); err != nil || !got.Exists {
		t.Errorf("an admin's push to an app made meanwhile: %+v, %v", got, err)
	}
	if _, err := f.b.AdmitPush(ctx, member, "fresh"); err != nil {
		t.Errorf("the maker's next push: %v", err)
	}
}

func deployedBranch(a *appv1.App, branch string) *appv1.App {
	a.Spec.Git.DeployBranch = branch
	return a
}

// cached is a backend on the shared control plane whose Reader is an informer
// cache of its own namespace, as cmd/bex has it: what it writes it must wait for
// before it returns.
type cached struct {
	b  *backend.Backend
	cp *testenv.ControlPlane
	r  client.Reader
	ns string
}

func newCached(t *testing.T, prefix string) *cached {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, prefix)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The directory's cache, as cmd/bex reads Apps: synced, running until ctx ends.
	_, c, err := access.Start(ctx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Reader, cfg.Namespace, cfg.Releases = cp.Client, c, ns, &fakeReleases{c: cp.Client}
	cfg.Log = slog.New(slog.DiscardHandler)
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cached{b: b, cp: cp, r: c, ns: ns}
}

// newApp is backend.NewApp into e's namespace, waiting on its cache.
func (e *cached) newApp(ctx context.Context, name string, members []string) (*appv1.App, error) {
	return backend.NewApp(ctx, e.cp.Client, e.r, e.ns, name, members, 30*time.Second)
}

func TestNewApp(t *testing.T) {
	e := newCached(t, "create")
	ctx := context.Background()

	got, err := e.newApp(ctx, "fresh", []string{"carol"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "fresh" || got.Spec.Git.DeployBranch != "" || !slices.Equal(got.Spec.Members, []string{"carol"}) {
		t.Fatalf("NewApp returned %+v", got.Spec)
	}
	// No polling: NewApp returns once the cache has the App.
	seen := &appv1.App{}
	if err := e.r.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "fresh"}, seen); err != nil {
		t.Fatalf("the cache right after NewApp: %v", err)
	}
	if !slices.Equal(seen.Spec.Members, []string{"carol"}) {
		t.Fatalf("the cache right after NewApp: %+v", seen.Spec)
	}
	// And it is a real App in the configured namespace.
	var stored appv1.App
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "fresh"}, &stored); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stored.Spec.Members, []string{"carol"}) {
		t.Fatalf("stored members %v", stored.Spec.Members)
	}

	if got, err := e.newApp(ctx, "fresh", []string{"dave"}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second NewApp: got %+v, %v; want AlreadyExists", got, err)
	}

	ownerless, err := e.newApp(ctx, "ownerless", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ownerless.Spec.Members) != 0 {
		t.Fatalf("app without owner has members %v", ownerless.Spec.Members)
	}

	// The API server's name rule is not bypassed.
	if _, err := e.newApp(ctx, "Not_A_Name", []string{"carol"}); err == nil || apierrors.IsAlreadyExists(err) {
		t.Fatalf("invalid name: %v", err)
	}
}

func TestSetDeployBranch(t *testing.T) {
	e := newCached(t, "branch")
	ctx := context.Background()
	carol := &backend.User{Name: "carol", CanCreateApps: true}
	if _, err := e.b.CreatePushedApp(ctx, carol, "site"); err != nil {
		t.Fatal(err)
	}
	// Another writer changes the members after the backend last saw the App; the
	// merge patch must not undo that.
	var a appv1.App
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "site"}, &a); err != nil {
		t.Fatal(err)
	}
	a.Spec.Members = append(a.Spec.Members, "dave")
	if err := e.cp.Client.Update(ctx, &a); err != nil {
		t.Fatal(err)
	}

	if err := e.b.SetDeployBranch(ctx, carol, "site", "release/v1"); err != nil {
		t.Fatal(err)
	}
	// No polling: SetDeployBranch returns once the cache has the change.
	got, err := e.b.AdmitPush(ctx, carol, "site")
	if err != nil {
		t.Fatal(err)
	}
	if got.DeployBranch != "release/v1" {
		t.Fatalf("deploy branch %q right after SetDeployBranch", got.DeployBranch)
	}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "site"}, &a); err != nil {
		t.Fatal(err)
	}
	if a.Spec.Git.DeployBranch != "release/v1" || !slices.Equal(a.Spec.Members, []string{"carol", "dave"}) {
		t.Fatalf("stored spec %+v", a.Spec)
	}

	if err := e.b.SetDeployBranch(ctx, carol, "site", ""); err != nil {
		t.Fatal(err)
	}
	if got, err := e.b.AdmitPush(ctx, carol, "site"); err != nil || got.DeployBranch != "" {
		t.Fatalf("after clearing: %+v, %v", got, err)
	}

	if err := e.b.SetDeployBranch(ctx, carol, "no-such-app", "main"); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("missing app: %v; want NotFound", err)
	}
	// The branch is the app's members' to set.
	eve := &backend.User{Name: "eve"}
	wantKind(t, "a stranger sets the branch", e.b.SetDeployBranch(ctx, eve, "site", "main"), backend.Forbidden, "no access")
}

// TestCacheWaitConfig: the bound of a write's wait for the cache (the push's
// app and deploy branch, every other write) is the backend's Config.CacheWait,
// half a minute by default, and a bound that is not positive is refused with
// the other problems, each by its field.
func TestCacheWaitConfig(t *testing.T) {
	if d := backend.DefaultConfig(); d.CacheWait != 30*time.Second {
		t.Fatalf("default CacheWait %s", d.CacheWait)
	}
	for _, bad := range []time.Duration{-time.Second, 0} {
		cfg := backend.DefaultConfig()
		cfg.Client, cfg.Namespace, cfg.Releases, cfg.CacheWait = newFixture(t).c, ns, &fakeReleases{}, bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.CacheWait") {
			t.Errorf("CacheWait %s: Validate() = %v", bad, err)
		}
	}
	// Every problem at once, each by its field.
	cfg := backend.DefaultConfig()
	cfg.CacheWait = -time.Second
	err := cfg.Validate()
	for _, want := range []string{"Config.Namespace", "Config.CacheWait"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}
