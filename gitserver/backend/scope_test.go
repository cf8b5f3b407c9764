package backend_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/tokens"
)

// operation is one exported method of the Backend, called by the tables of
// TestEveryOperationIsClassified with arguments that name what the fixture
// holds (the app shop, the database db).
type operation struct {
	changes bool
	call    func(ctx context.Context, b *backend.Backend, u *backend.User) error
}

func errOf(_ any, err error) error        { return err }
func errOf2(_, _ any, err error) error    { return err }
func errOf3(_, _, _ any, err error) error { return err }

const pg = appv1.EnginePostgres

// operations are the Backend's exported methods that act for a user, each
// marked as changing something or not. A method missing here fails
// TestEveryOperationIsClassified: a new operation is classified when it is
// added, and a changing one is then checked to refuse a read-only token.
var operations = map[string]operation{
	"AddKey": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf2(b.AddKey(ctx, u, "", "k2", strings.NewReader("")))
	}},
	"Keys": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error { return errOf(b.Keys(ctx, u, "")) }},
	"RemoveKey": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf3(b.RemoveKey(ctx, u, "", "laptop"))
	}},
	"AddUser": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.AddUser(ctx, u, "dan", false, false))
	}},
	"Users": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error { return errOf(b.Users(ctx, u)) }},
	"RemoveUser": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RemoveUser(ctx, u, "bob")
	}},
	"Apps": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error { return errOf(b.Apps(ctx, u)) }},
	"App": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.App(ctx, u, "shop"))
	}},
	"CreateApp": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.CreateApp(ctx, u, "new")
	}},
	"DestroyApp": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.DestroyApp(ctx, u, "shop", "shop")
	}},
	"Config": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Config(ctx, u, "shop"))
	}},
	"ConfigVar": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.ConfigVar(ctx, u, "shop", "A"))
	}},
	"ConfigValues": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.ConfigValues(ctx, u, "shop"))
	}},
	"ChangeConfig": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.ChangeConfig(ctx, u, "shop", backend.ConfigChange{Set: []backend.EnvVar{{Name: "A", Value: "1"}}}))
	}},
	"Cron": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Cron(ctx, u, "shop"))
	}},
	"CronRun": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.CronRun(ctx, u, "shop", "job")
	}},
	"DatabaseMembers": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DatabaseMembers(ctx, u, pg, "db"))
	}},
	"AddDatabaseMember": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.AddDatabaseMember(ctx, u, pg, "db", "bob")
	}},
	"RemoveDatabaseMember": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RemoveDatabaseMember(ctx, u, pg, "db", "ana")
	}},
	"DatabaseBackups": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DatabaseBackups(ctx, u, "db"))
	}},
	"CaptureDatabaseBackup": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.CaptureDatabaseBackup(ctx, u, "db", io.Discard))
	}},
	"RestoreDatabaseBackup": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RestoreDatabaseBackup(ctx, u, "db", "1", io.Discard)
	}},
	"Databases": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Databases(ctx, u, ""))
	}},
	"Database": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Database(ctx, u, pg, "db"))
	}},
	"CreateDatabase": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.CreateDatabase(ctx, u, backend.DatabaseRequest{Engine: pg, Name: "db2"}))
	}},
	"DestroyDatabase": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.DestroyDatabase(ctx, u, pg, "db", "db")
	}},
	"LinkDatabase": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.LinkDatabase(ctx, u, pg, "db", "shop", "OTHER_URL", io.Discard))
	}},
	"UnlinkDatabase": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.UnlinkDatabase(ctx, u, pg, "db", "shop", io.Discard))
	}},
	"DatabaseShell": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DatabaseShell(ctx, u, pg, "db", backend.DatabaseIO{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}))
	}},
	"BackupDatabase": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.BackupDatabase(ctx, u, "db", io.Discard, io.Discard)
	}},
	"RestoreDatabase": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RestoreDatabase(ctx, u, "db", strings.NewReader(""), io.Discard)
	}},
	"Deploy": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Deploy(ctx, u, "shop", ""))
	}},
	"Audit": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Audit(ctx, u, backend.AuditQuery{App: "shop"}))
	}},
	"AppCertificates": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.AppCertificates(ctx, u, "shop"))
	}},
	"Metrics": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Metrics(ctx, u, "shop"))
	}},
	"Releases": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf2(b.Releases(ctx, u, "shop", 10))
	}},
	"Rollback": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf2(b.Rollback(ctx, u, "shop", 1))
	}},
	"Domains": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Domains(ctx, u, "shop"))
	}},
	"AddDomain": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.AddDomain(ctx, u, "shop", "www.shop.example.com"))
	}},
	"RemoveDomain": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.RemoveDomain(ctx, u, "shop", "shop.example.com"))
	}},
	"DeployImage": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DeployImage(ctx, u, "shop", "ghcr.io/o/shop:v1", io.Discard))
	}},
	"RegistryLogin": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.RegistryLogin(ctx, u, "ghcr.io", "u", "p"))
	}},
	"RegistryLogout": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.RegistryLogout(ctx, u, "ghcr.io"))
	}},
	"Registries": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Registries(ctx, u))
	}},
	"Logs": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.Logs(ctx, u, "shop", backend.LogOptions{}, io.Discard)
	}},
	"Builds": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Builds(ctx, u, "shop"))
	}},
	"BuildLog": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf2(b.BuildLog(ctx, u, "shop", ""))
	}},
	"Members": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Members(ctx, u, "shop"))
	}},
	"AddMember": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.AddMember(ctx, u, "shop", "bob")
	}},
	"RemoveMember": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RemoveMember(ctx, u, "shop", "ana")
	}},
	"Processes": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Processes(ctx, u, "shop"))
	}},
	"SetSuspended": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.SetSuspended(ctx, u, "shop", true)
	}},
	"Scale": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Scale(ctx, u, "shop", []string{"web"}, map[string]int32{"web": 2}))
	}},
	"Resources": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Resources(ctx, u, "shop", "web"))
	}},
	"SetResources": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.SetResources(ctx, u, "shop", "web", backend.ResourceChange{Memory: resource.NewQuantity(256<<20, resource.BinarySI)}))
	}},
	"Restart": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.Restart(ctx, u, "shop", "")
	}},
	"AdmitPush": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.AdmitPush(ctx, u, "shop"))
	}},
	"CreatePushedApp": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.CreatePushedApp(ctx, u, "new"))
	}},
	"SetDeployBranch": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.SetDeployBranch(ctx, u, "shop", "dev")
	}},
	"Run": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Run(ctx, u, "shop", backend.RunOptions{Command: []string{"true"}}))
	}},
	"DiskUsage": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DiskUsage(ctx, u))
	}},
	"Prune": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Prune(ctx, u, false))
	}},
	"CreateToken": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.CreateToken(ctx, u, "more", "1h", backend.TokenScope{}))
	}},
	"Tokens": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error { return errOf(b.Tokens(ctx, u)) }},
	"RevokeToken": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RevokeToken(ctx, u, "ci")
	}},
	"Volumes": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Volumes(ctx, u, "shop"))
	}},
	"CreateVolume": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.CreateVolume(ctx, u, "shop", backend.VolumeRequest{Name: "data", Path: "/data"}, nil))
	}},
	"DestroyVolume": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.DestroyVolume(ctx, u, "shop", "data", "data")
	}},
	"BackupVolume": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.BackupVolume(ctx, u, "shop", "data", io.Discard, true, nil)
	}},
	"RestoreVolume": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.RestoreVolume(ctx, u, "shop", "data", strings.NewReader(""), true, nil)
	}},
	"Webhook": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.Webhook(ctx, u, "shop"))
	}},
	"RotateWebhookSecret": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.RotateWebhookSecret(ctx, u, "shop"))
	}},
	"DropPreviousWebhookSecret": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return b.DropPreviousWebhookSecret(ctx, u, "shop")
	}},
	"SetUpstream": {true, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.SetUpstream(ctx, u, "shop", "", nil))
	}},
	// Without --rotate it reads the key, and makes one when the app has none:
	// webhook settings are no limited token's.
	"DeployKey": {false, func(ctx context.Context, b *backend.Backend, u *backend.User) error {
		return errOf(b.DeployKey(ctx, u, "shop", false))
	}},
}

// notOperations are the exported methods that act for no user's request, and why.
var notOperations = map[string]string{
	"Host":            "a setting",
	"Internal":        "logging",
	"WhoAmI":          "who the caller is",
	"Hook":            "the webhook handler's lookup (no user: the delivery's signature)",
	"Redeploy":        "the webhook handler's deploy (no user: the delivery's signature)",
	"Await":           "waits for a release an operation made",
	"BackupSchedules": "the server's scheduler",
	"CachedDatabase":  "the rechecks' read",
	"Recheck":         "the rechecks",
	"VerifyToken":     "the MCP server's door",
	"Pushed":          "the audit entry of a push AdmitPush admitted",
	"DiskPressure":    "the server's disk, no app's",
}

// scopeFixture holds the users ana (an admin) and bob, the app shop (bob a
// member, linked to the database db), cart (bob's too), and db (bob's), each
// user with their key.
func scopeFixture(t *testing.T) (*fixture, map[string]*backend.User) {
	t.Helper()
	anaKey, anaFP := keyAndFingerprint(t)
	bobKey, bobFP := keyAndFingerprint(t)
	anaObj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "ana", UID: "uid-ana"}, Spec: appv1.UserSpec{Role: appv1.RoleAdmin, CanCreateApps: true,
		Keys: []appv1.SSHKey{{Name: "laptop", PublicKey: anaKey}}}}
	bobObj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob", UID: "uid-bob"}, Spec: appv1.UserSpec{Role: appv1.RoleMember, CanCreateApps: true,
		Keys: []appv1.SSHKey{{Name: "laptop", PublicKey: bobKey}}}}
	shop := deployed(app("shop", "bob"))
	shop.Spec.Domains = []string{"shop.example.com"}
	shop.Spec.Env = []appv1.EnvVar{{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret("db"), Key: appv1.CredentialURL}}}
	shop.Spec.Cron = []appv1.CronJob{{ID: "job", Command: "true", Schedule: "@daily"}}
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns, UID: "uid-db"},
		Spec: appv1.DatabaseSpec{Engine: pg, Size: resource.MustParse("1Gi"), Members: []string{"bob", "ana"}}, Status: appv1.DatabaseStatus{Host: "10.0.0.1", Port: 5432}}
	other := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns, UID: "uid-other"},
		Spec: appv1.DatabaseSpec{Engine: pg, Size: resource.MustParse("1Gi"), Members: []string{"bob"}}}
	f := newFixtureWith(t, func(c *backend.Config) {
		c.Tokens = &tokens.Store{Client: c.Client, Users: c.Client, Namespace: "bex-system"}
		c.RolloutTimeout = 100 * time.Millisecond // no deployer: the controls' waits end at once
	}, anaObj, bobObj, shop, deployed(app("cart", "bob")), db, other)
	return f, map[string]*backend.User{"ana": backend.UserOf(anaObj, "laptop", anaFP), "bob": backend.UserOf(bobObj, "laptop", bobFP)}
}

// stored is everything the fixture's API holds, each object with its
// resourceVersion: equal before and after an operation that wrote nothing.
func stored(t *testing.T, c client.Client) string {
	t.Helper()
	var out []string
	for _, l := range []client.ObjectList{&appv1.AppList{}, &appv1.UserList{}, &appv1.DatabaseList{}, &appv1.ReleaseList{}, &corev1.SecretList{}} {
		if err := c.List(context.Background(), l); err != nil {
			t.Fatal(err)
		}
		items, _ := metaItems(l)
		for _, o := range items {
			out = append(out, fmt.Sprintf("%T %s/%s@%s", l, o.GetNamespace(), o.GetName(), o.GetResourceVersion()))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func metaItems(l client.ObjectList) ([]metav1.Object, error) {
	v := reflect.ValueOf(l).Elem().FieldByName("Items")
	var out []metav1.Object
	for i := range v.Len() {
		out = append(out, v.Index(i).Addr().Interface().(metav1.Object))
	}
	return out, nil
}

// TestEveryOperationIsClassified: every exported method of the Backend is
// either in notOperations or in operations, marked as changing or not; each
// changing one refuses a read-only token (an admin's, with the key session's
// powers otherwise) with a Forbidden error that says the token is read-only,
// and writes nothing; each reading one writes nothing for it either. The
// control: the same calls by the admin's unlimited session are not refused
// as read-only (most of them change what the fixture holds).
func TestEveryOperationIsClassified(t *testing.T) {
	typ := reflect.TypeFor[*backend.Backend]()
	var names []string
	for i := range typ.NumMethod() {
		name := typ.Method(i).Name
		names = append(names, name)
		_, op := operations[name]
		_, other := notOperations[name]
		if op == other {
			t.Errorf("Backend.%s is in neither or both of operations and notOperations: classify it (a changing operation calls u.mayChange first)", name)
		}
	}
	for name := range operations {
		if !slices.Contains(names, name) {
			t.Errorf("operations lists %s, which the Backend has no longer", name)
		}
	}
	for name, op := range operations {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			f, users := scopeFixture(t)
			ro := *users["ana"]
			ro.KeyName, ro.KeyFingerprint, ro.Scope = "token:ro", "", backend.TokenScope{ReadOnly: true}
			before := stored(t, f.c)
			err := op.call(ctx, f.b, &ro)
			readOnly := errors.Is(err, backend.ErrForbidden) && strings.Contains(err.Error(), "this token is read-only")
			if op.changes && !readOnly {
				t.Errorf("a read-only token: %v; want a Forbidden error saying the token is read-only", err)
			}
			if after := stored(t, f.c); after != before {
				t.Errorf("a read-only token's call wrote to the API:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if op.changes {
				if err := op.call(ctx, f.b, users["ana"]); err != nil && strings.Contains(err.Error(), "read-only") {
					t.Errorf("the control, ana's key session: %v", err)
				}
			}
		})
	}
}

// TestAppScopedTokens: a token limited to the app shop lists, reads and
// changes shop only; any other name, an app of its user's or one that does
// not exist, is Forbidden alike before anything is read; it sees the
// databases linked to shop only; it has none of its user's powers beyond
// apps (creating apps, keys, tokens, an admin's wildcard domains and user
// list); and the rechecks of a running call keep its scope. The controls:
// the same user's unlimited token does all of it.
func TestAppScopedTokens(t *testing.T) {
	f, users := scopeFixture(t)
	ctx := context.Background()
	bob, ana := users["bob"], users["ana"]

	// --apps: apps bob may use, by their names.
	if err := f.c.Create(ctx, app("secret", "carol")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ app, want string }{
		{"nope", `not_found: --apps: no app "nope"`},
		{"Bad", `invalid: --apps: "Bad" is not an app name`},
		{"secret", "forbidden: --apps: user bob has no access to app secret"},
	} {
		_, err := f.b.CreateToken(ctx, bob, "x", "1h", backend.TokenScope{Apps: []string{"shop", c.app}})
		if got := backend.KindOf(err).String() + ": " + fmt.Sprint(err); !strings.HasPrefix(got, c.want) {
			t.Errorf("--apps shop,%s: %q, want %q", c.app, got, c.want)
		}
	}
	made, err := f.b.CreateToken(ctx, bob, "shop-only", "1h", backend.TokenScope{Apps: []string{"shop"}})
	if err != nil || made.Scope.String() != "apps shop" {
		t.Fatalf("CreateToken: %+v %v", made, err)
	}
	u, name, err := f.b.VerifyToken(ctx, made.Token)
	if err != nil || name != "shop-only" || !slices.Equal(u.Scope.Apps, []string{"shop"}) || u.Scope.ReadOnly {
		t.Fatalf("VerifyToken: %+v %q %v", u, name, err)
	}
	full, err := f.b.CreateToken(ctx, bob, "full", "1h", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	bobFull, _, err := f.b.VerifyToken(ctx, full.Token)
	if err != nil || bobFull.Scope.Limited() {
		t.Fatalf("VerifyToken of the unlimited token: %+v %v", bobFull, err)
	}

	names := func(u *backend.User) string {
		apps, err := f.b.Apps(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range apps {
			out = append(out, a.Name)
		}
		dbs, err := f.b.Databases(ctx, u, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dbs {
			out = append(out, "db:"+d.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(u); got != "shop db:db" {
		t.Errorf("the scoped token lists %q, want shop and the database linked to it", got)
	}
	if got := names(bobFull); got != "cart shop db:db db:other" {
		t.Errorf("the control, bob's unlimited token, lists %q", got)
	}

	forbidden := func(what string, err error, want string) {
		t.Helper()
		if !errors.Is(err, backend.ErrForbidden) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want forbidden: ...%s...", what, err, want)
		}
	}
	const outside = "this token is limited to the apps shop: "
	_, err = f.b.App(ctx, u, "cart")
	forbidden("App cart", err, outside+"cart is not one of them")
	_, err = f.b.App(ctx, u, "nope")
	forbidden("App of an app that does not exist", err, outside+"nope is not one of them")
	forbidden("Logs of cart", f.b.Logs(ctx, u, "cart", backend.LogOptions{}, io.Discard), outside)
	forbidden("SetSuspended cart", f.b.SetSuspended(ctx, u, "cart", true), outside)
	_, err = f.b.AdmitPush(ctx, u, "cart")
	forbidden("AdmitPush cart", err, outside)
	if _, err := f.b.Database(ctx, u, pg, "other"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("a database linked to no app of the token: %v; want not_found, as one that does not exist", err)
	}
	if _, err := f.b.App(ctx, u, "shop"); err != nil {
		t.Errorf("App shop: %v", err)
	}
	if err := f.b.SetSuspended(ctx, u, "shop", true); err != nil {
		t.Errorf("SetSuspended shop: %v", err)
	}
	if _, err := f.b.Database(ctx, u, pg, "db"); err != nil {
		t.Errorf("the database linked to shop: %v", err)
	}

	// None of bob's powers beyond apps.
	const beyond = "this token is limited to the apps shop: "
	forbidden("CreateApp", f.b.CreateApp(ctx, u, "new"), beyond+"apps:create is for ssh or a token made without --apps and --read-only")
	_, err = f.b.CreateDatabase(ctx, u, backend.DatabaseRequest{Engine: pg, Name: "db2"})
	forbidden("CreateDatabase", err, beyond+"postgres:create")
	forbidden("DestroyDatabase", f.b.DestroyDatabase(ctx, u, pg, "db", "db"), beyond+"postgres:destroy")
	_, err = f.b.Keys(ctx, u, "")
	forbidden("Keys", err, beyond+"keys")
	_, err = f.b.Tokens(ctx, u)
	forbidden("Tokens", err, beyond+"tokens:list")
	forbidden("RevokeToken", f.b.RevokeToken(ctx, u, "full"), beyond+"tokens:revoke")
	_, err = f.b.Webhook(ctx, u, "shop")
	forbidden("Webhook", err, beyond+"webhooks")
	// Within its apps, the token works on them, but neither says who may use
	// them nor destroys one.
	forbidden("AddMember shop", f.b.AddMember(ctx, u, "shop", "ana"), beyond+"access:add is for ssh")
	forbidden("RemoveMember shop", f.b.RemoveMember(ctx, u, "shop", "bob"), beyond+"access:remove is for ssh")
	forbidden("DestroyApp shop", f.b.DestroyApp(ctx, u, "shop", "shop"), beyond+"apps:destroy is for ssh")
	if _, err := f.b.App(ctx, u, "shop"); err != nil {
		t.Errorf("shop after the refused destroy: %v", err)
	}
	// An admin's scoped token is no admin's beyond its apps.
	anaTok, err := f.b.CreateToken(ctx, ana, "shop-only", "1h", backend.TokenScope{Apps: []string{"shop"}})
	if err != nil {
		t.Fatal(err)
	}
	anaScoped, _, err := f.b.VerifyToken(ctx, anaTok.Token)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.b.Users(ctx, anaScoped)
	forbidden("Users", err, beyond+"users:list")
	_, err = f.b.AddDomain(ctx, anaScoped, "shop", "*.shop.example.org")
	forbidden("a wildcard domain", err, "wildcard domains are for admins")
	if _, err := f.b.App(ctx, anaScoped, "shop"); err != nil {
		t.Errorf("ana's scoped token on shop, of which she is no member: %v", err)
	}
	if _, err := f.b.Users(ctx, ana); err != nil {
		t.Errorf("the control, ana's key session: %v", err)
	}

	// The rechecks rebuild the user from the User object: the scope stays.
	if err := f.b.Recheck(ctx, u, []string{"shop"}); err != nil {
		t.Errorf("Recheck of shop: %v", err)
	}
	forbidden("Recheck of cart", f.b.Recheck(ctx, u, []string{"cart"}), "your access to cart was removed")
	if err := f.b.Recheck(ctx, bobFull, []string{"cart"}); err != nil {
		t.Errorf("the control, Recheck of cart for the unlimited token: %v", err)
	}
}
