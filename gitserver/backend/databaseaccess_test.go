package backend_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

// racingClient lets another writer change a Database between the backend's
// read and its write, once: the write then meets a conflict on the API
// server, as it does when the deployer writes the status meanwhile.
type racingClient struct {
	client.Client
	mu   sync.Mutex
	race func(ctx context.Context, db *appv1.Database)
}

func (c *racingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.mu.Lock()
	race := c.race
	c.race = nil
	c.mu.Unlock()
	if db, ok := obj.(*appv1.Database); ok && race != nil {
		race(ctx, db)
	}
	return c.Client.Update(ctx, obj, opts...)
}

// accessEnv is a backend on the shared control plane whose Reader is the
// informer cache of its namespace, as cmd/bex has it, with users of names of
// its own (Users are cluster-scoped) and a runner for the databases' one-offs.
type accessEnv struct {
	b      *backend.Backend
	cp     *testenv.ControlPlane
	r      client.Reader
	ns     string
	log    *testenv.SyncBuffer
	runner *dbRunner
	racing *racingClient
}

func newAccessEnv(t *testing.T) *accessEnv {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	e := &accessEnv{cp: cp, ns: cp.Namespace(t, "dbaccess"), log: &testenv.SyncBuffer{}, runner: &dbRunner{}, racing: &racingClient{Client: cp.Client}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, c, err := access.Start(ctx, access.Config{Namespace: e.ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	e.r = c
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Reader, cfg.Namespace, cfg.Releases, cfg.Runner = e.racing, c, e.ns, &fakeReleases{c: cp.Client}, e.runner
	cfg.CacheWait = 10 * time.Second
	cfg.Log = slog.New(slog.NewTextHandler(e.log, nil))
	if e.b, err = backend.New(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// user makes a User named base-<namespace> and returns it as the backend
// sees it.
func (e *accessEnv) user(t *testing.T, base string, role appv1.UserRole) *backend.User {
	t.Helper()
	u := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: base + "-" + e.ns}, Spec: appv1.UserSpec{Role: role, CanCreateApps: true}}
	if err := e.cp.Client.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.cp.Client.Delete(context.Background(), u) })
	return &backend.User{Name: u.Name, Admin: role == appv1.RoleAdmin, CanCreateApps: true, KeyName: "laptop"}
}

// database makes a Database as the deployer leaves it once it runs, and
// waits until the backend's cache has it so.
func (e *accessEnv) database(t *testing.T, name string, engine appv1.DatabaseEngine, members ...string) {
	t.Helper()
	ctx := context.Background()
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: appv1.DatabaseSpec{Engine: engine, Size: resource.MustParse("64Mi"), Members: members}}
	if err := e.cp.Client.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	db.Status = appv1.DatabaseStatus{Phase: appv1.DatabaseRunning, Host: "127.0.0.1", Port: 15432, Version: "16.4",
		Image: "bex.local/" + string(engine) + "@sha256:" + strings.Repeat("c", 64)}
	if err := e.cp.Client.Status().Update(ctx, db); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the cache has database "+name+" running", func() error {
		c := &appv1.Database{}
		if err := e.r.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, c); err != nil {
			return err
		}
		if c.Status.Phase != appv1.DatabaseRunning {
			return fmt.Errorf("%s is %q in the cache", name, c.Status.Phase)
		}
		return nil
	})
}

// members is the database's members as the API server has them.
func (e *accessEnv) members(t *testing.T, name string) []string {
	t.Helper()
	db := &appv1.Database{}
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, db); err != nil {
		t.Fatal(err)
	}
	return db.Spec.Members
}

// TestDatabaseAccess: postgres:access:* and redis:access:* on a real API
// server, read back through the cache the commands read: a member added sees,
// links and runs psql on the database at once; removed, it is unknown to them
// again; a non-member cannot add themselves; USER must exist; the other
// engine's database is an unknown name.
func TestDatabaseAccess(t *testing.T) {
	e := newAccessEnv(t)
	ctx := context.Background()
	ana := e.user(t, "ana", appv1.RoleAdmin)
	bob := e.user(t, "bob", appv1.RoleMember)
	carol := e.user(t, "carol", appv1.RoleMember)
	dave := e.user(t, "dave", appv1.RoleMember)
	e.database(t, "shop", appv1.EnginePostgres, bob.Name)
	e.database(t, "cache", appv1.EngineRedis, bob.Name)
	board := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "board", Namespace: e.ns}, Spec: appv1.AppSpec{Members: []string{carol.Name}}}
	if err := e.cp.Client.Create(ctx, board); err != nil {
		t.Fatal(err)
	}

	// A non-member is told what an unknown name tells, and changes nothing.
	_, hidden := e.b.DatabaseMembers(ctx, carol, appv1.EnginePostgres, "shop")
	_, unknown := e.b.DatabaseMembers(ctx, carol, appv1.EnginePostgres, "shoq")
	wantKind(t, "access:list by a non-member", hidden, backend.NotFound, `no postgres database "shop": postgres:list shows the ones you can use`)
	if unknown == nil || strings.ReplaceAll(unknown.Error(), "shoq", "shop") != hidden.Error() {
		t.Errorf("a non-member's line (%v) and an unknown name's (%v) differ", hidden, unknown)
	}
	for what, err := range map[string]error{
		"a non-member adds themselves":    e.b.AddDatabaseMember(ctx, carol, appv1.EnginePostgres, "shop", carol.Name),
		"a non-member removes a member":   e.b.RemoveDatabaseMember(ctx, carol, appv1.EnginePostgres, "shop", bob.Name),
		"a non-member adds to an unknown": e.b.AddDatabaseMember(ctx, carol, appv1.EnginePostgres, "shoq", carol.Name),
	} {
		wantKind(t, what, err, backend.NotFound, `no postgres database "sho`)
	}
	if m := e.members(t, "shop"); !slices.Equal(m, []string{bob.Name}) {
		t.Fatalf("shop's members after a non-member's tries: %v", m)
	}

	// The other engine's database is an unknown name, even to its member.
	for what, err := range map[string]error{
		"postgres:access:list of a redis database":   func() error { _, err := e.b.DatabaseMembers(ctx, bob, appv1.EnginePostgres, "cache"); return err }(),
		"postgres:access:add to a redis database":    e.b.AddDatabaseMember(ctx, bob, appv1.EnginePostgres, "cache", carol.Name),
		"postgres:access:remove of a redis database": e.b.RemoveDatabaseMember(ctx, bob, appv1.EnginePostgres, "cache", bob.Name),
	} {
		wantKind(t, what, err, backend.NotFound, `no postgres database "cache": postgres:list shows the ones you can use`)
	}
	wantKind(t, "redis:access:add to a postgres database", e.b.AddDatabaseMember(ctx, ana, appv1.EngineRedis, "shop", carol.Name),
		backend.NotFound, `no redis database "shop": redis:list shows`)
	_, err := e.b.DatabaseMembers(ctx, bob, "mysql", "shop")
	wantKind(t, "an engine bex has not", err, backend.Invalid, `"mysql" is not a database engine`)
	wantKind(t, "a name no database can have", e.b.AddDatabaseMember(ctx, bob, appv1.EnginePostgres, "Bad_Name", carol.Name), backend.Invalid, "is not a database name")

	// USER must exist: one line.
	for _, nobody := range []string{"nobody-" + e.ns, "Bad_Name", "../x"} {
		err := e.b.AddDatabaseMember(ctx, bob, appv1.EnginePostgres, "shop", nobody)
		wantKind(t, "adding "+nobody, err, backend.NotFound, `no user "`+nobody+`": an admin creates users with users:add`)
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("not one line: %q", err)
		}
	}

	// A member adds carol; another writer changes the Database between the
	// read and the write (the write conflicts, is retried on the new one,
	// and keeps the other's change).
	e.racing.mu.Lock()
	e.racing.race = func(ctx context.Context, db *appv1.Database) {
		other := &appv1.Database{}
		if err := e.cp.Client.Get(ctx, client.ObjectKeyFromObject(db), other); err != nil {
			t.Error(err)
			return
		}
		other.Spec.Members = append(other.Spec.Members, dave.Name)
		if err := e.cp.Client.Update(ctx, other); err != nil {
			t.Error(err)
		}
	}
	e.racing.mu.Unlock()
	if err := e.b.AddDatabaseMember(ctx, bob, appv1.EnginePostgres, "shop", carol.Name); err != nil {
		t.Fatal(err)
	}
	if m := e.members(t, "shop"); !slices.Equal(m, []string{bob.Name, dave.Name, carol.Name}) {
		t.Fatalf("shop's members after a conflicting add: %v", m)
	}
	// No polling: the add returns once the cache has it.
	al, err := e.b.DatabaseMembers(ctx, carol, appv1.EnginePostgres, "shop")
	if err != nil || al.Database != "shop" || al.Engine != "postgres" || !slices.Equal(al.Members, []string{bob.Name, dave.Name, carol.Name}) {
		t.Fatalf("postgres:access:list by the member added: %+v %v", al, err)
	}
	if list, err := e.b.Databases(ctx, carol, appv1.EnginePostgres); err != nil || len(list) != 1 || list[0].Name != "shop" {
		t.Errorf("postgres:list of the member added: %+v %v", list, err)
	}
	if in, err := e.b.Database(ctx, carol, appv1.EnginePostgres, "shop"); err != nil || in.Host != "127.0.0.1" {
		t.Errorf("postgres:info by the member added: %+v %v", in, err)
	}
	if res, err := e.b.LinkDatabase(ctx, carol, appv1.EnginePostgres, "shop", "board", "", nil); err != nil || res.Vars[0] != "DATABASE_URL" {
		t.Errorf("postgres:link by the member added: %+v %v", res, err)
	}
	if exit, err := e.b.DatabaseShell(ctx, carol, appv1.EnginePostgres, "shop", backend.DatabaseIO{Stdin: strings.NewReader("SELECT 1;\n"), Stdout: &strings.Builder{}}); err != nil || exit != 0 {
		t.Errorf("postgres:psql by the member added: %d %v", exit, err)
	} else if s := e.runner.last(); s.App == nil || s.App.Name != "shop.db" {
		t.Errorf("psql ran as %+v", s.App)
	}
	err = e.b.AddDatabaseMember(ctx, bob, appv1.EnginePostgres, "shop", carol.Name)
	wantKind(t, "adding a member again", err, backend.Conflict, carol.Name+" has access to shop already")

	// Removed, carol is told what an unknown name tells; removing again is a line.
	if err := e.b.RemoveDatabaseMember(ctx, bob, appv1.EnginePostgres, "shop", carol.Name); err != nil {
		t.Fatal(err)
	}
	_, gone := e.b.Database(ctx, carol, appv1.EnginePostgres, "shop")
	_, unknownInfo := e.b.Database(ctx, carol, appv1.EnginePostgres, "shoq")
	if gone == nil || unknownInfo == nil || strings.ReplaceAll(unknownInfo.Error(), "shoq", "shop") != gone.Error() {
		t.Errorf("postgres:info after the removal: %v, of an unknown name: %v", gone, unknownInfo)
	}
	_, err = e.b.DatabaseShell(ctx, carol, appv1.EnginePostgres, "shop", backend.DatabaseIO{})
	wantKind(t, "psql after the removal", err, backend.NotFound, `no postgres database "shop"`)
	wantKind(t, "carol adds herself back", e.b.AddDatabaseMember(ctx, carol, appv1.EnginePostgres, "shop", carol.Name), backend.NotFound, `no postgres database "shop"`)
	wantKind(t, "removing a non-member", e.b.RemoveDatabaseMember(ctx, bob, appv1.EnginePostgres, "shop", carol.Name),
		backend.NotFound, carol.Name+" is not a member of shop (postgres:access:list shop shows who is)")

	// An admin may change any database's members, down to none.
	if err := e.b.AddDatabaseMember(ctx, ana, appv1.EngineRedis, "cache", dave.Name); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{bob.Name, dave.Name} {
		if err := e.b.RemoveDatabaseMember(ctx, ana, appv1.EngineRedis, "cache", m); err != nil {
			t.Fatal(err)
		}
	}
	if al, err := e.b.DatabaseMembers(ctx, ana, appv1.EngineRedis, "cache"); err != nil || al.Members == nil || len(al.Members) != 0 {
		t.Errorf("redis:access:list of a database left to admins: %+v %v", al, err)
	}

	log := e.log.String()
	for _, w := range []string{
		"backend.user=" + bob.Name + " backend.key=laptop",
		"command=postgres:access:add backend.database=shop backend.member=" + carol.Name,
		"command=postgres:access:remove backend.database=shop backend.member=" + carol.Name,
		"command=redis:access:add backend.database=cache backend.member=" + dave.Name,
		"command=redis:access:remove backend.database=cache backend.member=" + bob.Name,
	} {
		if !strings.Contains(log, w) {
			t.Errorf("the audit log lacks %q:\n%s", w, log)
		}
	}
	if n := strings.Count(log, "command=postgres:access:add"); n != 1 {
		t.Errorf("%d audit lines of postgres:access:add, want 1 (the refusals log none):\n%s", n, log)
	}
}
