package backend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// The password the credentials Secret of the test's databases holds: nothing
// the backend shows may contain it.
const dbPassword = "pw-Zx8vQ1mR4tL0"

// database is a Database as the deployer leaves it once it runs (phase
// Running, its address and image), or, with phase "", as just created.
func database(name string, engine appv1.DatabaseEngine, phase appv1.DatabasePhase, members ...string) *appv1.Database {
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-db-" + name)},
		Spec: appv1.DatabaseSpec{Engine: engine, Size: resource.MustParse("1Gi"), Members: members}}
	if phase != "" {
		db.Status = appv1.DatabaseStatus{Phase: phase, Host: "127.0.0.1", Port: 15432, Version: "16.4", Image: "bex.local/" + string(engine) + "@sha256:" + strings.Repeat("c", 64)}
	}
	return db
}

// credentials is the Secret the deployer writes for a database.
func credentials(name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: appv1.CredentialsSecret(name), Namespace: ns, Labels: map[string]string{appv1.LabelDatabase: name}},
		Data: map[string][]byte{appv1.CredentialPassword: []byte(dbPassword),
			appv1.CredentialURL: []byte("postgres://" + name + ":" + dbPassword + "@127.0.0.1:15432/" + name)}}
}

func (f *fixture) getApp(t *testing.T, name string) *appv1.App {
	t.Helper()
	a := &appv1.App{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
		t.Fatal(err)
	}
	return a
}

// noPassword fails when v, as JSON, holds the password.
func noPassword(t *testing.T, what string, v any) {
	t.Helper()
	raw, _ := json.Marshal(v)
	if strings.Contains(string(raw), dbPassword) {
		t.Errorf("%s shows the password: %s", what, raw)
	}
}

func TestDatabaseRules(t *testing.T) {
	f := newFixture(t, deployed(app("notes", "bob")), deployed(app("zeta", "carol")), app("fresh", "bob"),
		database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob"), credentials("shop"),
		database("cache", appv1.EngineRedis, appv1.DatabaseRunning, "carol"), credentials("cache"),
		database("early", appv1.EnginePostgres, "", "bob"))
	ctx := context.Background()

	// Who sees what: a member its own, an admin all; a list never holds the
	// password.
	list, err := f.b.Databases(ctx, member, "")
	if err != nil || len(list) != 2 || list[0].Name != "early" || list[1].Name != "shop" {
		t.Fatalf("a member's databases: %+v %v", list, err)
	}
	if list, _ := f.b.Databases(ctx, member, appv1.EngineRedis); len(list) != 0 {
		t.Errorf("a member's redis databases: %+v", list)
	}
	all, err := f.b.Databases(ctx, admin, "")
	if err != nil || len(all) != 3 {
		t.Errorf("an admin's databases: %+v %v", all, err)
	}
	noPassword(t, "the list", all)
	_, err = f.b.Databases(ctx, member, "mysql")
	wantKind(t, "an engine bex has not", err, backend.Invalid, `"mysql" is not a database engine`)

	in, err := f.b.Database(ctx, member, appv1.EnginePostgres, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if in.Engine != "postgres" || in.Status != "Running" || in.Host != "127.0.0.1" || in.Port != 15432 || in.Database != "shop" || in.User != "shop" ||
		in.Version != "16.4" || in.Size != "1Gi" || in.Memory != "256Mi" || in.Instances != 1 || len(in.Links) != 0 || in.UsedBytes != nil {
		t.Errorf("postgres:info shop: %+v", in)
	}
	noPassword(t, "postgres:info", in)
	if in, err := f.b.Database(ctx, member, appv1.EnginePostgres, "early"); err != nil || in.Status != "Pending" || in.Port != 0 {
		t.Errorf("a database the deployer has not seen yet: %+v %v", in, err)
	}

	// A database one may not use reads as one that does not exist.
	_, hidden := f.b.Database(ctx, member, appv1.EngineRedis, "cache")
	_, unknown := f.b.Database(ctx, member, appv1.EngineRedis, "cachx")
	wantKind(t, "another's database", hidden, backend.NotFound, `no redis database "cache"`)
	if unknown == nil || strings.ReplaceAll(unknown.Error(), "cachx", "cache") != hidden.Error() {
		t.Errorf("another's database (%v) and an unknown one (%v) are told apart", hidden, unknown)
	}
	_, err = f.b.Database(ctx, admin, appv1.EnginePostgres, "cache")
	wantKind(t, "postgres:info of a redis database", err, backend.NotFound, "cache is a redis database, not a postgres one: redis:info cache")
	_, err = f.b.Database(ctx, member, appv1.EngineRedis, "shop")
	wantKind(t, "redis:info of one's postgres database", err, backend.NotFound, "shop is a postgres database")
	for _, bad := range []string{"Bad_Name", "../x", "a.db", strings.Repeat("a", 41)} {
		_, err := f.b.Database(ctx, member, appv1.EnginePostgres, bad)
		wantKind(t, "the name "+bad, err, backend.Invalid, "is not a database name")
	}

	// Creating: the permission to create apps; the creator is its member;
	// the API's defaults for what is not given; bounds checked here.
	_, err = f.b.CreateDatabase(ctx, guest, backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "mine"})
	wantKind(t, "a guest creates one", err, backend.Forbidden, "may not create databases")
	for _, c := range []struct {
		req  backend.DatabaseRequest
		want string
	}{
		{backend.DatabaseRequest{Engine: "mysql", Name: "x"}, `"mysql" is not a database engine`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "X"}, `"X" is not a database name`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Size: "1Ki"}, `--size "1Ki": give a size from 16Mi to 16Ti`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Size: "lots"}, `--size "lots"`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Size: "17Ti"}, `--size "17Ti"`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Memory: "1Mi"}, `--memory "1Mi": give a limit from 16Mi to 64Gi`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Version: "latest"}, `--version "latest"`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Version: "16; drop"}, `--version "16; drop"`},
		{backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "x", Instances: 4}, "--instances 4: from 1 to 3"},
	} {
		_, err := f.b.CreateDatabase(ctx, member, c.req)
		wantKind(t, c.want, err, backend.Invalid, c.want)
	}
	_, err = f.b.CreateDatabase(ctx, member, backend.DatabaseRequest{Engine: appv1.EngineRedis, Name: "cache"})
	wantKind(t, "a name taken", err, backend.Conflict, "a database named cache exists already")
	made, err := f.b.CreateDatabase(ctx, member, backend.DatabaseRequest{Engine: appv1.EnginePostgres, Name: "orders"})
	if err != nil || made.Status != "Pending" || made.Size != "1Gi" || made.Memory != "256Mi" {
		t.Fatalf("postgres:create orders: %+v %v", made, err)
	}
	db := &appv1.Database{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders"}, db); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(db.Spec.Members, []string{"bob"}) || db.Spec.Size.Value() != appv1.DefaultDatabaseSize || db.Spec.Resources != nil ||
		db.Spec.Instances != 1 || db.Spec.Engine != appv1.EnginePostgres || db.Spec.Version != "" {
		t.Errorf("the Database made: %+v", db.Spec)
	}
	if _, err := f.b.CreateDatabase(ctx, member, backend.DatabaseRequest{Engine: appv1.EngineRedis, Name: "queue", Version: "7", Size: "64Mi", Memory: "128Mi", Instances: 2}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "queue"}, db); err != nil {
		t.Fatal(err)
	}
	if db.Spec.Size.String() != "64Mi" || db.Spec.Resources.Memory.String() != "128Mi" || db.Spec.Instances != 2 || db.Spec.Version != "7" {
		t.Errorf("the Database made with every flag: %+v", db.Spec)
	}

	// Linking: a reference to the Secret's url, never its value; one release.
	_, err = f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "zeta", "", nil)
	wantKind(t, "link to another's app", err, backend.Forbidden, "no access to app zeta")
	_, err = f.b.LinkDatabase(ctx, member, appv1.EngineRedis, "cache", "notes", "", nil)
	wantKind(t, "link another's database", err, backend.NotFound, `no redis database "cache"`)
	_, err = f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", "1BAD", nil)
	wantKind(t, "link --as a name a shell refuses", err, backend.Invalid, `"1BAD" is not a config var name`)
	_, err = f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "early", "notes", "", nil)
	wantKind(t, "link a database not made yet", err, backend.Conflict, "the database early is not made yet (Pending)")
	res, err := f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", "", nil)
	if err != nil || res.Release != 4 || res.Description != "Link shop as DATABASE_URL" || !slices.Equal(res.Vars, []string{"DATABASE_URL"}) {
		t.Fatalf("postgres:link shop notes: %+v %v", res, err)
	}
	env := f.getApp(t, "notes").Spec.Env
	want := appv1.EnvVar{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: "bex-db-shop", Key: appv1.CredentialURL}}
	if len(env) != 1 || env[0].Name != want.Name || env[0].Value != "" || env[0].ValueFrom == nil || *env[0].ValueFrom != *want.ValueFrom {
		t.Fatalf("the app's env after the link: %+v", env)
	}
	noPassword(t, "the app after the link", f.getApp(t, "notes"))
	if res, err := f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", "DATABASE_URL", nil); err != nil || res.Description != "" || res.Release != 0 {
		t.Errorf("the same link again changes nothing: %+v %v", res, err)
	}
	if _, err := f.b.ChangeConfig(ctx, member, "notes", backend.ConfigChange{Set: []backend.EnvVar{{Name: "MINE", Value: "x"}}}); err != nil {
		t.Fatal(err)
	}
	_, err = f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", "MINE", nil)
	wantKind(t, "link over a var set otherwise", err, backend.Conflict, "notes has a config var MINE already: link with --as ANOTHER_NAME")
	if res, err := f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", "READ_URL", nil); err != nil || res.Release != 6 {
		t.Fatalf("a second link as READ_URL: %+v %v", res, err)
	}
	if want := []string{"bob: Link shop as DATABASE_URL", "bob: Set MINE", "bob: Link shop as READ_URL"}; !slices.Equal(f.rel.recorded, want) {
		t.Errorf("releases recorded: %q, want %q", f.rel.recorded, want)
	}
	if st, err := f.b.App(ctx, member, "notes"); err != nil || !slices.Equal(st.Databases, []string{"shop"}) {
		t.Errorf("apps:info names the linked databases: %+v %v", st, err)
	}
	if in, err := f.b.Database(ctx, member, appv1.EnginePostgres, "shop"); err != nil || !slices.Equal(in.Links, []string{"notes"}) {
		t.Errorf("postgres:info shows the link: %+v %v", in, err)
	}
	// Before the app's first deploy the spec keeps the link, no release.
	if res, err := f.b.LinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "fresh", "", nil); err != nil || res.Release != 0 || len(f.rel.recorded) != 3 {
		t.Errorf("link before the first deploy: %+v %v %q", res, err, f.rel.recorded)
	}
	if env := f.getApp(t, "fresh").Spec.Env; len(env) != 1 || env[0].ValueFrom == nil || env[0].ValueFrom.Name != "bex-db-shop" {
		t.Errorf("fresh's env: %+v", env)
	}
	// An admin links anything to anything.
	if _, err := f.b.LinkDatabase(ctx, admin, appv1.EngineRedis, "cache", "zeta", "", nil); err != nil {
		t.Fatal(err)
	}
	if env := f.getApp(t, "zeta").Spec.Env; len(env) != 1 || env[0].Name != "REDIS_URL" || env[0].ValueFrom.Name != "bex-db-cache" {
		t.Errorf("redis:link's default var: %+v", env)
	}

	// Destroying is refused while linked, naming the apps, confirmed or not.
	err = f.b.DestroyDatabase(ctx, member, appv1.EnginePostgres, "shop", "shop")
	wantKind(t, "destroy a linked database", err, backend.Conflict, "shop is linked to fresh, notes: postgres:unlink shop APP for each first")
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("not one line: %q", err)
	}
	// Unlinking takes every var from the database away, in one release.
	res, err = f.b.UnlinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", nil)
	if err != nil || res.Release != 7 || !slices.Equal(res.Vars, []string{"DATABASE_URL", "READ_URL"}) {
		t.Fatalf("postgres:unlink shop notes: %+v %v", res, err)
	}
	if env := f.getApp(t, "notes").Spec.Env; len(env) != 1 || env[0].Name != "MINE" {
		t.Errorf("notes' env after the unlink: %+v", env)
	}
	_, err = f.b.UnlinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "notes", nil)
	wantKind(t, "unlink what is not linked", err, backend.NotFound, "notes is not linked to shop")
	_, err = f.b.UnlinkDatabase(ctx, member, appv1.EngineRedis, "cache", "zeta", nil)
	wantKind(t, "unlink another's database", err, backend.NotFound, `no redis database "cache"`)
	if _, err := f.b.UnlinkDatabase(ctx, member, appv1.EnginePostgres, "shop", "fresh", nil); err != nil {
		t.Fatal(err)
	}

	wantKind(t, "destroy without confirming", f.b.DestroyDatabase(ctx, member, appv1.EnginePostgres, "shop", "shp"), backend.Invalid, "run postgres:destroy shop --confirm shop")
	wantKind(t, "destroy another's", f.b.DestroyDatabase(ctx, member, appv1.EngineRedis, "cache", "cache"), backend.NotFound, `no redis database "cache"`)
	wantKind(t, "destroy with the wrong engine", f.b.DestroyDatabase(ctx, member, appv1.EngineRedis, "shop", "shop"), backend.NotFound, "shop is a postgres database")
	if err := f.b.DestroyDatabase(ctx, member, appv1.EnginePostgres, "shop", "shop"); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop"}, &appv1.Database{}); !apierrors.IsNotFound(err) {
		t.Errorf("shop after postgres:destroy: %v", err)
	}
	for _, w := range []string{"command=postgres:create backend.database=orders", "command=postgres:link backend.app=notes backend.database=shop backend.var=DATABASE_URL",
		"command=postgres:unlink backend.app=notes", "command=postgres:destroy backend.database=shop", "backend.user=bob"} {
		if !strings.Contains(f.log.String(), w) {
			t.Errorf("the audit log lacks %q:\n%s", w, f.log.String())
		}
	}
	if strings.Contains(f.log.String(), dbPassword) {
		t.Errorf("the log holds the password")
	}
}

// dbRunner records the one-offs it gets; a run copies its stdin to its stdout
// and exits with exit.
type dbRunner struct {
	mu   sync.Mutex
	runs []backend.RunSpec
	exit int
}

func (r *dbRunner) Run(_ context.Context, s backend.RunSpec) (int, error) {
	r.mu.Lock()
	r.runs = append(r.runs, s)
	r.mu.Unlock()
	if s.Stdin != nil {
		_, _ = io.Copy(s.Stdout, s.Stdin)
	}
	return r.exit, nil
}

func (r *dbRunner) Start(context.Context, backend.RunSpec, func(int)) error {
	panic("a database's one-off is never detached")
}

func (r *dbRunner) last() backend.RunSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[len(r.runs)-1]
}

func TestDatabaseOneOffs(t *testing.T) {
	r := &dbRunner{}
	shop := database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob")
	cache := database("cache", appv1.EngineRedis, appv1.DatabaseRunning, "bob")
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner = r }, shop, credentials("shop"), cache, credentials("cache"),
		database("early", appv1.EnginePostgres, appv1.DatabaseCreating, "bob"),
		database("broken", appv1.EnginePostgres, appv1.DatabaseFailed, "bob"),
		database("theirs", appv1.EnginePostgres, appv1.DatabaseRunning, "carol"))
	ctx := context.Background()

	// checkSpec checks what every database one-off is: the database's image,
	// the synthetic App the deployer runs it as, its URL from the Secret.
	checkSpec := func(what string, db *appv1.Database, envName string, script ...string) backend.RunSpec {
		t.Helper()
		s := r.last()
		a := s.App
		if a == nil || a.Name != db.Name+".db" || a.Namespace != ns || a.UID != db.UID || a.Labels[appv1.LabelDatabase] != db.Name {
			t.Errorf("%s: the App it runs as: %+v", what, a)
		}
		if s.Image != db.Status.Image || len(s.ID) != 12 || s.Process != "run."+s.ID {
			t.Errorf("%s: image %q, id %q, process %q", what, s.Image, s.ID, s.Process)
		}
		if len(s.Env) != 1 || s.Env[0].Name != envName || s.Env[0].Value != "" || s.Env[0].ValueFrom == nil ||
			*s.Env[0].ValueFrom != (appv1.SecretKeySelector{Name: "bex-db-" + db.Name, Key: appv1.CredentialURL}) {
			t.Errorf("%s: env %+v", what, s.Env)
		}
		if len(s.Command) != 3 || s.Command[0] != "sh" || s.Command[1] != "-c" {
			t.Fatalf("%s: command %q", what, s.Command)
		}
		for _, w := range script {
			if !strings.Contains(s.Command[2], w) {
				t.Errorf("%s: %q lacks %q", what, s.Command[2], w)
			}
		}
		return s
	}

	// psql: SQL from stdin, the exit status of psql.
	var out bytes.Buffer
	r.exit = 3
	exit, err := f.b.DatabaseShell(ctx, member, appv1.EnginePostgres, "shop", backend.DatabaseIO{Stdin: strings.NewReader("SELECT 1;\n"), Stdout: &out, Stderr: &out})
	if err != nil || exit != 3 || out.String() != "SELECT 1;\n" {
		t.Fatalf("postgres:psql: %d %v %q", exit, err, out.String())
	}
	if s := checkSpec("psql", shop, "DATABASE_URL", `exec psql`, `"$DATABASE_URL"`); s.TTY != nil {
		t.Errorf("psql without a terminal got one")
	}
	// Under ssh -t the terminal passes.
	tty := &backend.TTY{Term: "xterm", Width: 80, Height: 24}
	r.exit = 0
	if _, err := f.b.DatabaseShell(ctx, member, appv1.EnginePostgres, "shop", backend.DatabaseIO{Stdout: io.Discard, TTY: tty}); err != nil || r.last().TTY != tty {
		t.Errorf("psql on a terminal: %v %+v", err, r.last().TTY)
	}
	if _, err := f.b.DatabaseShell(ctx, member, appv1.EngineRedis, "cache", backend.DatabaseIO{Stdin: strings.NewReader("PING\n"), Stdout: io.Discard}); err != nil {
		t.Fatal(err)
	}
	checkSpec("redis:cli", cache, "REDIS_URL", `exec redis-cli`, `-u "$REDIS_URL"`)

	// backup: the dump to w; restore: the dump from stdin, in one transaction.
	if err := f.b.BackupDatabase(ctx, member, "shop", &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if s := checkSpec("backup", shop, "DATABASE_URL", "exec pg_dump", "--format=custom", `"$DATABASE_URL"`); s.Stdin != nil || s.TTY != nil || s.Stdout != &out {
		t.Errorf("backup: stdin %v, tty %v, stdout %v", s.Stdin, s.TTY, s.Stdout)
	}
	var msgs bytes.Buffer
	if err := f.b.RestoreDatabase(ctx, member, "shop", strings.NewReader("PGDMP dump"), &msgs); err != nil || msgs.String() != "PGDMP dump" {
		t.Fatalf("restore: %v %q", err, msgs.String())
	}
	checkSpec("restore", shop, "DATABASE_URL", "exec pg_restore", "--clean", "--if-exists", "--no-owner", "--no-acl", "--single-transaction", "--exit-on-error", `--dbname "$DATABASE_URL"`)
	r.exit = 1
	err = f.b.RestoreDatabase(ctx, member, "shop", strings.NewReader("garbage"), io.Discard)
	wantKind(t, "a restore that fails", err, backend.Failed, "pg_restore exited with 1, and nothing was restored: the data is as it was")
	err = f.b.BackupDatabase(ctx, member, "shop", io.Discard, io.Discard)
	wantKind(t, "a backup that fails", err, backend.Failed, "pg_dump exited with 1")

	// Refusals, none of which reaches the runner.
	n := len(r.runs)
	_, err = f.b.DatabaseShell(ctx, member, appv1.EnginePostgres, "early", backend.DatabaseIO{})
	wantKind(t, "psql before it runs", err, backend.Conflict, "the database early is not running (Creating): postgres:info early says when it is")
	err = f.b.BackupDatabase(ctx, member, "broken", io.Discard, io.Discard)
	wantKind(t, "a backup of a failed database", err, backend.Conflict, "the database broken is not running (Failed)")
	_, err = f.b.DatabaseShell(ctx, member, appv1.EnginePostgres, "theirs", backend.DatabaseIO{})
	wantKind(t, "psql on another's database", err, backend.NotFound, `no postgres database "theirs"`)
	err = f.b.BackupDatabase(ctx, member, "cache", io.Discard, io.Discard)
	wantKind(t, "postgres:backup of a redis database", err, backend.NotFound, "cache is a redis database")
	err = f.b.RestoreDatabase(ctx, member, "Bad", strings.NewReader(""), io.Discard)
	wantKind(t, "a bad name", err, backend.Invalid, `"Bad" is not a database name`)
	if len(r.runs) != n {
		t.Errorf("refused one-offs reached the runner: %d", len(r.runs)-n)
	}
	if _, err := f.b.DatabaseShell(ctx, admin, appv1.EnginePostgres, "theirs", backend.DatabaseIO{Stdout: io.Discard}); err != nil {
		t.Errorf("an admin's psql on any database: %v", err)
	}
	noRunner := newFixture(t, database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob"))
	_, err = noRunner.b.DatabaseShell(ctx, member, appv1.EnginePostgres, "shop", backend.DatabaseIO{})
	wantKind(t, "a server without a runner", err, backend.Invalid, "cannot run one-off commands")
	if !strings.Contains(f.log.String(), "command=postgres:restore backend.database=shop") {
		t.Errorf("no audit line of the restore:\n%s", f.log.String())
	}
}

// TestRemovedUserLeavesTheDatabases: users:remove takes the user out of every
// database's members, so that a user made again under the name does not get
// them back.
func TestRemovedUserLeavesTheDatabases(t *testing.T) {
	bob := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob"}}
	f := newFixture(t, bob, database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob", "carol"),
		database("cache", appv1.EngineRedis, appv1.DatabaseRunning, "carol"))
	ctx := context.Background()
	if err := backend.DeleteUser(ctx, f.c, "bob", ns); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{"shop": {"carol"}, "cache": {"carol"}} {
		db := &appv1.Database{}
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, db); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(db.Spec.Members, want) {
			t.Errorf("%s's members after bob was removed: %v, want %v", name, db.Spec.Members, want)
		}
	}
}
