package databases

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// fakeRuntime reports each database's server ready at an address of its own
// once told to (ready), and records what it was asked.
type fakeRuntime struct {
	mu      sync.Mutex
	ready   map[string]netip.AddrPort
	synced  map[string]runtime.Desired
	deleted map[string]bool
	// failing: the restart tokens whose release fails (ImageNotFound), and
	// stays failed, as the local runtime remembers a failed release.
	failing map[string]bool
}

func (f *fakeRuntime) Sync(_ context.Context, d runtime.Desired) (runtime.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced[d.App.Name] = d
	st := runtime.Status{Processes: map[string]runtime.ProcessStatus{}}
	if f.failing[d.App.Name+"/"+d.Restarts[d.Servers[0]]] {
		st.Failure, st.Message = appv1.ImageNotFoundReason, "image is not in containerd"
		return st, nil
	}
	if a, ok := f.ready[d.App.Name]; ok {
		st.Serving, st.RolledOut = d.Release, true
		st.Addresses = map[string][]netip.AddrPort{d.Servers[0]: {a}}
	}
	return st, nil
}

func (f *fakeRuntime) Delete(_ context.Context, k types.NamespacedName) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted[k.Name] = true
	return nil
}

func (f *fakeRuntime) setReady(name string, a netip.AddrPort) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready[name] = a
}

func (f *fakeRuntime) desired(name string) (runtime.Desired, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.synced[name]
	return d, ok
}

// fakeNetwork records what each name leads to.
type fakeNetwork struct {
	mu    sync.Mutex
	rules map[string]string
}

var gateway = netip.MustParseAddr("10.88.0.1")

func (n *fakeNetwork) Host() netip.Addr { return gateway }

func (n *fakeNetwork) Expose(_ context.Context, name string, port uint16, target netip.AddrPort) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rules[name] = fmt.Sprintf("%d->%s", port, target)
	return nil
}

func (n *fakeNetwork) Unexpose(_ context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.rules, name)
	return nil
}

func (n *fakeNetwork) rule(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rules[name]
}

type env struct {
	t   *testing.T
	c   client.Client
	ns  string
	rt  *fakeRuntime
	net *fakeNetwork
	// used is what the data volume's Usage says.
	used atomic.Int64
}

func start(t *testing.T, cfg Config) *env {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "databases")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	skip := true
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, c: cp.Client, ns: ns,
		rt:  &fakeRuntime{ready: map[string]netip.AddrPort{}, synced: map[string]runtime.Desired{}, deleted: map[string]bool{}, failing: map[string]bool{}},
		net: &fakeNetwork{rules: map[string]string{}}}
	r := &Reconciler{Client: mgr.GetClient(), Runtime: e.rt, Network: e.net, Config: cfg,
		Usage: func(key types.NamespacedName, volume string) (int64, error) {
			if volume != volumeName {
				return 0, fmt.Errorf("%s has no volume %q", key, volume)
			}
			return e.used.Load(), nil
		}}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	return e
}

func testConfig() Config {
	c := DefaultConfig()
	c.Postgres = Image{Ref: "bex-base.local/postgres:15", Version: "15"}
	c.RequeueStarting, c.RequeueRunning = 50*time.Millisecond, time.Second
	return c
}

func (e *env) create(name string, engine appv1.DatabaseEngine, mutate ...func(*appv1.Database)) {
	e.t.Helper()
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: appv1.DatabaseSpec{Engine: engine, Size: resource.MustParse("64Mi")}}
	for _, m := range mutate {
		m(db)
	}
	if err := e.c.Create(context.Background(), db); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) db(name string) *appv1.Database {
	e.t.Helper()
	db := &appv1.Database{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, db); err != nil {
		e.t.Fatal(err)
	}
	return db
}

func (e *env) eventually(what string, f func() error) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, what, f)
}

func TestADatabaseGetsCredentialsAnAddressAndItsServer(t *testing.T) {
	e := start(t, testConfig())
	e.create("shop", appv1.EnginePostgres)
	e.eventually("a port, then a server asked of the runtime", func() error {
		if _, ok := e.rt.desired("shop.db"); !ok || e.db("shop").Status.Port == 0 {
			return fmt.Errorf("status %+v", e.db("shop").Status)
		}
		return nil
	})
	db := e.db("shop")
	if db.Status.Phase != appv1.DatabaseCreating || db.Status.Host != gateway.String() || db.Status.Port < 25000 || db.Status.Port > 25999 {
		t.Fatalf("before the server is ready: %+v", db.Status)
	}
	d, _ := e.rt.desired("shop.db")
	p := d.Processes["postgres"]
	if !slices.Equal(d.Servers, []string{"postgres"}) || p.Replicas != 1 || d.Image != "bex-base.local/postgres:15" ||
		len(d.Volumes) != 1 || d.Volumes[0].Path != postgresData || d.Volumes[0].Size.String() != "64Mi" ||
		p.MemoryBytes() != appv1.DefaultDatabaseMemory || !strings.Contains(strings.Join(p.Command, " "), "flock 9") {
		t.Fatalf("desired: %+v", d)
	}
	for _, v := range d.Env {
		if v.Name == "POSTGRES_PASSWORD" && (v.ValueFrom == nil || v.ValueFrom.Name != "bex-db-shop") {
			t.Fatalf("the password must come from the Secret, not be copied: %+v", v)
		}
	}

	s := &corev1.Secret{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: appv1.CredentialsSecret("shop")}, s); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(string(s.Data["url"]))
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	if s.Labels[appv1.LabelDatabase] != "shop" || u.Scheme != "postgres" || u.Host != fmt.Sprintf("%s:%d", gateway, db.Status.Port) ||
		u.User.Username() != "shop" || u.Path != "/shop" || len(pw) != 32 || string(s.Data["password"]) != pw || string(s.Data["port"]) != fmt.Sprint(db.Status.Port) {
		t.Fatalf("credentials: %v %q", s.Labels, s.Data)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != db.UID {
		t.Fatalf("the Secret is the database's: %+v", s.OwnerReferences)
	}

	target := netip.MustParseAddrPort("10.88.0.7:40001")
	e.used.Store(5<<20 + 12345)
	e.rt.setReady("shop.db", target)
	e.eventually("running, with its address led to the server", func() error {
		db := e.db("shop")
		if db.Status.Phase != appv1.DatabaseRunning || !meta.IsStatusConditionTrue(db.Status.Conditions, appv1.ReadyCondition) {
			return fmt.Errorf("status %+v", db.Status)
		}
		if got, want := e.net.rule(e.ns+"/shop.db"), fmt.Sprintf("%d->%s", db.Status.Port, target); got != want {
			return fmt.Errorf("exposed %q, want %q", got, want)
		}
		if db.Status.UsedBytes != 5<<20 {
			return fmt.Errorf("usedBytes %d, want the volume's 5 MiB (rounded down to a MiB)", db.Status.UsedBytes)
		}
		return nil
	})

	// A second database gets a port of its own; the first keeps its password.
	e.create("cache", appv1.EngineRedis)
	e.eventually("the second database's port", func() error {
		if p := e.db("cache").Status.Port; p == 0 || p == e.db("shop").Status.Port {
			return fmt.Errorf("port %d", p)
		}
		return nil
	})
	again := &corev1.Secret{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: appv1.CredentialsSecret("shop")}, again); err != nil {
		t.Fatal(err)
	}
	if string(again.Data["password"]) != pw {
		t.Fatal("the password changed")
	}
	rs := &corev1.Secret{}
	e.eventually("the redis credentials", func() error {
		return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: appv1.CredentialsSecret("cache")}, rs)
	})
	if ru := string(rs.Data["url"]); !strings.HasPrefix(ru, "redis://default:") || rs.Data["user"] != nil {
		t.Fatalf("redis url %q", ru)
	}
}

func TestTheLinksAreTheAppsThatTakeACredential(t *testing.T) {
	e := start(t, testConfig())
	e.create("shop", appv1.EnginePostgres)
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}, Spec: appv1.AppSpec{Env: []appv1.EnvVar{
		{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret("shop"), Key: "url"}},
	}}}
	if err := e.c.Create(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	e.eventually("linked", func() error {
		if l := e.db("shop").Status.Links; !slices.Equal(l, []string{"web"}) {
			return fmt.Errorf("links %v", l)
		}
		return nil
	})
	app.Spec.Env = nil
	if err := e.c.Update(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	e.eventually("unlinked", func() error {
		if l := e.db("shop").Status.Links; len(l) != 0 {
			return fmt.Errorf("links %v", l)
		}
		return nil
	})
}

func TestDeletingADatabaseRemovesItsServerAddressAndCredentials(t *testing.T) {
	e := start(t, testConfig())
	e.create("gone", appv1.EnginePostgres)
	e.rt.setReady("gone.db", netip.MustParseAddrPort("10.88.0.9:40002"))
	e.eventually("running", func() error {
		if e.net.rule(e.ns+"/gone.db") == "" {
			return fmt.Errorf("not exposed")
		}
		return nil
	})
	if err := e.c.Delete(context.Background(), e.db("gone")); err != nil {
		t.Fatal(err)
	}
	e.eventually("gone", func() error {
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "gone"}, &appv1.Database{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	e.rt.mu.Lock()
	deleted := e.rt.deleted["gone.db"]
	e.rt.mu.Unlock()
	err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: appv1.CredentialsSecret("gone")}, &corev1.Secret{})
	if !deleted || e.net.rule(e.ns+"/gone.db") != "" || !apierrors.IsNotFound(err) {
		t.Fatalf("left behind: runtime deleted %v, rule %q, secret %v", deleted, e.net.rule(e.ns+"/gone.db"), err)
	}
}

func TestWhatThisPlatformCannotRunFailsWithALine(t *testing.T) {
	e := start(t, testConfig())
	e.create("old", appv1.EnginePostgres, func(d *appv1.Database) { d.Spec.Version = "12" })
	e.create("big", appv1.EnginePostgres, func(d *appv1.Database) { d.Spec.Instances = 3 })
	for name, want := range map[string]string{"old": "postgres 12 is not offered here", "big": "at most 1"} {
		e.eventually(name+" failed", func() error {
			db := e.db(name)
			c := meta.FindStatusCondition(db.Status.Conditions, appv1.ReadyCondition)
			if db.Status.Phase != appv1.DatabaseFailed || c == nil || !strings.Contains(c.Message, want) {
				return fmt.Errorf("status %+v", db.Status)
			}
			return nil
		})
		if _, ok := e.rt.desired(name + ".db"); ok {
			t.Fatalf("%s: a server was asked for", name)
		}
	}
}

// TestAFailedServerIsTriedAgain: the runtime keeps a failed release failed
// (an image not there yet: bex up imports the stand-ins after the deployer
// starts); the controller tries it again with a new restart token, kept on
// the Database, so that the running server is not restarted by the next look.
func TestAFailedServerIsTriedAgain(t *testing.T) {
	e := start(t, testConfig())
	e.rt.mu.Lock()
	e.rt.failing["late.db/"] = true
	e.rt.ready["late.db"] = netip.MustParseAddrPort("10.89.0.9:5432")
	e.rt.mu.Unlock()
	e.create("late", appv1.EnginePostgres)
	e.eventually("late runs after a try with a new token", func() error {
		if db := e.db("late"); db.Status.Phase != appv1.DatabaseRunning {
			return fmt.Errorf("status %+v", db.Status)
		}
		return nil
	})
	token := e.db("late").Annotations[appv1.RestartedAtAnnotation]
	d, _ := e.rt.desired("late.db")
	if token == "" || d.Restarts["postgres"] != token {
		t.Fatalf("restart token %q, the server's %v", token, d.Restarts)
	}
}

func TestVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{{"15", "15.4", true}, {"15.4", "15", true}, {"15", "1", false}, {"15", "16", false}, {"7", "7.0", true}} {
		if got := isPrefixVersion(c.a, c.b); got != c.want {
			t.Errorf("isPrefixVersion(%q, %q) = %v", c.a, c.b, got)
		}
	}
}
