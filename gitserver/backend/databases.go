package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Databases: the managed Postgres and Redis of postgres:* and redis:* (and the
// MCP tools databases, create_database, link_database, unlink_database). The
// backend writes Databases and the config vars that link apps to them; the
// deployer runs them and writes their credentials Secret, which the backend
// never reads: a link is a reference to the Secret's url key, so the password
// is never copied into an App, a Release or anything shown.
//
// Who may do what: an admin everything; a user the databases whose
// spec.members lists them (the creator is one). A database a user may not see
// is answered exactly as one that does not exist. Creating one takes the
// permission to create apps. Linking needs access to the database and to the
// app.

// DatabaseInfo is one database, as postgres:info, redis:info and the
// databases tool show it. It never holds the password.
type DatabaseInfo struct {
	Name   string `json:"name"`
	Engine string `json:"engine" jsonschema:"postgres or redis"`
	// Version is the version that runs, else the one asked for ("" for the
	// platform's).
	Version string `json:"version"`
	Status  string `json:"status" jsonschema:"Pending, Creating, Running, Failed or Deleting"`
	// Message says why it is not ready, when it is not.
	Message string `json:"message,omitempty"`
	// Host and Port are where linked apps reach it (0 until it has them).
	Host string `json:"host"`
	Port int32  `json:"port"`
	// Database and User are Postgres's (empty for Redis); the password is in
	// the credentials a link gives an app, never here.
	Database string `json:"database,omitempty"`
	User     string `json:"user,omitempty"`
	// Size is the disk asked for (1Gi), SizeBytes the same in bytes; UsedBytes
	// what its data takes, when measured (null otherwise).
	Size      string `json:"size"`
	SizeBytes int64  `json:"sizeBytes"`
	UsedBytes *int64 `json:"usedBytes"`
	// Memory is its server's memory limit, default included.
	Memory    string `json:"memory"`
	Instances int32  `json:"instances"`
	// Links are the apps whose config takes a variable from its credentials.
	Links   []string  `json:"links"`
	Members []string  `json:"members"`
	Created time.Time `json:"created"`
}

// DatabaseRequest is what postgres:create and redis:create ask for.
type DatabaseRequest struct {
	Engine appv1.DatabaseEngine
	Name   string
	// Version is the engine's major version ("16"); empty: the platform's.
	Version string
	// Size is the data's disk as a quantity (10Gi); empty: DefaultDatabaseSize.
	Size string
	// Memory is the server's memory limit (512Mi); empty: DefaultDatabaseMemory.
	Memory string
	// Instances is how many servers run (1 to 3); 0: 1.
	Instances int32
}

// LinkResult is a recorded link or unlink.
type LinkResult struct {
	Database string `json:"database"`
	App      string `json:"app"`
	// Vars are the config vars set (link) or removed (unlink).
	Vars []string `json:"vars"`
	// Release is the new release of the app, 0 before its first deploy (the
	// spec keeps the change for it) or when nothing changed.
	Release int64 `json:"release"`
	// Description says what changed; "" when nothing did (linked already).
	Description string `json:"description"`
}

// DatabaseIO are the streams of a database's one-off (psql, redis-cli).
type DatabaseIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// TTY, when not nil, gives the tool a terminal (ssh -t).
	TTY *TTY
}

// databaseVersion is spec.version's rule (the API's pattern, checked here so
// that the refusal is one line that says it).
var databaseVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)

func checkDatabaseName(name string) error {
	if err := appv1.CheckDatabaseName(name); err != nil {
		return &Error{Kind: Invalid, Msg: err.Error()}
	}
	return nil
}

func checkEngine(e appv1.DatabaseEngine) error {
	if !slices.Contains(appv1.Engines, e) {
		return Errorf(Invalid, "%q is not a database engine: use postgres or redis", e)
	}
	return nil
}

// noSuchDatabase is the answer for a database that does not exist and for
// one the user may not see alike, so that nothing tells them apart.
func noSuchDatabase(engine appv1.DatabaseEngine, name string) error {
	if engine == "" {
		return Errorf(NotFound, "no database %q: postgres:list and redis:list show the ones you can use", name)
	}
	return Errorf(NotFound, "no %s database %q: %s:list shows the ones you can use", engine, name, engine)
}

// database reads a database u may use, of engine (any when ""), and records
// it in ctx's Uses (the request's access to it is then checked again while it
// runs). A database u may not use is answered as one that does not exist; one
// of another engine is named with its engine (once u may see it).
func (b *Backend) database(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string) (*appv1.Database, error) {
	if err := checkDatabaseName(name); err != nil {
		return nil, err
	}
	db := &appv1.Database{}
	if err := b.cfg.Reader.Get(ctx, b.key(name), db); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, noSuchDatabase(engine, name)
		}
		return nil, fmt.Errorf("reading database %s: %w", name, err)
	}
	ok, err := b.mayUseDatabase(ctx, u, db)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, noSuchDatabase(engine, name)
	}
	if engine != "" && db.Spec.Engine != engine {
		return nil, Errorf(NotFound, "%s is a %s database, not a %s one: %s:info %s shows it", name, db.Spec.Engine, engine, db.Spec.Engine, name)
	}
	UsedDatabase(ctx, db.Name)
	return db, nil
}

// mayUseDatabase reports whether u may use db: a member (or an admin), and,
// through a token limited to some apps, only a database linked to one of them
// (mayUseLinked).
func (b *Backend) mayUseDatabase(ctx context.Context, u *User, db *appv1.Database) (bool, error) {
	if !u.member(db.Spec.Members) {
		return false, nil
	}
	if len(u.Scope.Apps) == 0 {
		return true, nil
	}
	links, err := b.links(ctx, db.Name)
	if err != nil {
		return false, err
	}
	return mayUseLinked(u, db, links), nil
}

// mayUseLinked is mayUseDatabase's rule for a database whose linked apps are
// links: a token limited to some apps reaches the databases of those apps,
// and no other.
func mayUseLinked(u *User, db *appv1.Database, links []string) bool {
	return u.member(db.Spec.Members) && (len(u.Scope.Apps) == 0 || slices.ContainsFunc(links, u.Scope.AllowsApp))
}

// dbOp names the operation op on a database of engine as its ssh command
// does (postgres:destroy), or of both when engine is none of them.
func dbOp(engine appv1.DatabaseEngine, op string) string {
	if slices.Contains(appv1.Engines, engine) {
		return string(engine) + ":" + op
	}
	return "postgres:" + op + " and redis:" + op
}

// links are the apps whose config takes a variable from the credentials of
// the database named name: every app's, not only those u may use, since any
// of them breaks when the database goes.
func (b *Backend) links(ctx context.Context, name string) ([]string, error) {
	var apps appv1.AppList
	if err := b.cfg.Reader.List(ctx, &apps, client.InNamespace(b.cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("listing apps: %w", err)
	}
	out := []string{}
	for _, a := range apps.Items {
		if slices.Contains(appv1.LinkedDatabases(a.Spec.Env), name) {
			out = append(out, a.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// linksOf maps each database to the apps linked to it, from one listing.
func (b *Backend) linksOf(ctx context.Context) (map[string][]string, error) {
	var apps appv1.AppList
	if err := b.cfg.Reader.List(ctx, &apps, client.InNamespace(b.cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("listing apps: %w", err)
	}
	slices.SortFunc(apps.Items, func(x, y appv1.App) int { return strings.Compare(x.Name, y.Name) })
	out := map[string][]string{}
	for _, a := range apps.Items {
		for _, db := range appv1.LinkedDatabases(a.Spec.Env) {
			out[db] = append(out[db], a.Name)
		}
	}
	return out, nil
}

func databaseInfoOf(db *appv1.Database, links []string) DatabaseInfo {
	in := DatabaseInfo{Name: db.Name, Engine: string(db.Spec.Engine), Version: db.Status.Version, Status: string(db.Status.Phase),
		Host: db.Status.Host, Port: db.Status.Port, Size: db.Spec.Size.String(), SizeBytes: db.Spec.Size.Value(),
		Instances: max(db.Spec.Instances, 1), Links: nonNil(links), Members: nonNil(db.Spec.Members), Created: db.CreationTimestamp.UTC()}
	if in.Version == "" {
		in.Version = db.Spec.Version
	}
	switch {
	case !db.DeletionTimestamp.IsZero():
		in.Status = string(appv1.DatabaseDeleting)
	case in.Status == "":
		in.Status = string(appv1.DatabasePending)
	}
	if c := meta.FindStatusCondition(db.Status.Conditions, appv1.ReadyCondition); c != nil && c.Status != metav1.ConditionTrue {
		in.Message = c.Message
	}
	if db.Spec.Engine == appv1.EnginePostgres {
		in.Database, in.User = appv1.PostgresName(db.Name), appv1.PostgresName(db.Name)
	}
	if db.Status.UsedBytes > 0 {
		used := db.Status.UsedBytes
		in.UsedBytes = &used
	}
	mem := int64(appv1.DefaultDatabaseMemory)
	if r := db.Spec.Resources; r != nil && r.Memory != nil {
		mem = r.Memory.Value()
	}
	in.Memory = resource.NewQuantity(mem, resource.BinarySI).String()
	return in
}

// Databases lists the databases of engine (all when "") that u may use, by
// name.
func (b *Backend) Databases(ctx context.Context, u *User, engine appv1.DatabaseEngine) ([]DatabaseInfo, error) {
	if engine != "" {
		if err := checkEngine(engine); err != nil {
			return nil, err
		}
	}
	var list appv1.DatabaseList
	if err := b.cfg.Reader.List(ctx, &list, client.InNamespace(b.cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("listing databases: %w", err)
	}
	links, err := b.linksOf(ctx)
	if err != nil {
		return nil, err
	}
	out := []DatabaseInfo{}
	for i := range list.Items {
		db := &list.Items[i]
		if (engine == "" || db.Spec.Engine == engine) && mayUseLinked(u, db, links[db.Name]) {
			out = append(out, databaseInfoOf(db, links[db.Name]))
		}
	}
	slices.SortFunc(out, func(x, y DatabaseInfo) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

// Database is one database of engine (any when "") that u may use.
func (b *Backend) Database(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string) (*DatabaseInfo, error) {
	db, err := b.database(ctx, u, engine, name)
	if err != nil {
		return nil, err
	}
	links, err := b.links(ctx, db.Name)
	if err != nil {
		return nil, err
	}
	in := databaseInfoOf(db, links)
	return &in, nil
}

// CreateDatabase creates a database whose first member is u; the deployer
// then makes its server, its credentials and its status (Pending until then).
func (b *Backend) CreateDatabase(ctx context.Context, u *User, req DatabaseRequest) (*DatabaseInfo, error) {
	if err := u.mayChange(dbOp(req.Engine, "create")); err != nil {
		return nil, err
	}
	if err := checkEngine(req.Engine); err != nil {
		return nil, err
	}
	if err := checkDatabaseName(req.Name); err != nil {
		return nil, err
	}
	if !u.CanCreateApps {
		return nil, Errorf(Forbidden, "user %s may not create databases: ask an admin to create %s and make you one of its members", u.Name, req.Name)
	}
	if err := u.unlimited(dbOp(req.Engine, "create")); err != nil {
		return nil, err
	}
	if req.Version != "" && (len(req.Version) > 16 || !databaseVersion.MatchString(req.Version)) {
		return nil, Errorf(Invalid, "--version %q: give the engine's version as numbers, e.g. --version 16", req.Version)
	}
	size := resource.NewQuantity(appv1.DefaultDatabaseSize, resource.BinarySI)
	if req.Size != "" {
		q, err := resource.ParseQuantity(req.Size)
		if err != nil || q.Value() < appv1.MinVolumeSize || q.Value() > appv1.MaxVolumeSize {
			return nil, Errorf(Invalid, "--size %q: give a size from 16Mi to 16Ti, e.g. --size 10Gi", req.Size)
		}
		size = &q
	}
	var res *appv1.Resources
	if req.Memory != "" {
		q, err := resource.ParseQuantity(req.Memory)
		if err != nil || q.Value() < appv1.MinMemory || q.Value() > appv1.MaxMemory {
			return nil, Errorf(Invalid, "--memory %q: give a limit from 16Mi to 64Gi, e.g. --memory 512Mi", req.Memory)
		}
		res = &appv1.Resources{Memory: &q}
	}
	if req.Instances < 0 || req.Instances > 3 {
		return nil, Errorf(Invalid, "--instances %d: from 1 to 3", req.Instances)
	}
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: b.cfg.Namespace},
		Spec: appv1.DatabaseSpec{Engine: req.Engine, Version: req.Version, Size: *size, Resources: res,
			Instances: max(req.Instances, 1), Members: []string{u.Name}}}
	var dryRun []client.CreateOption
	if planOf(ctx) != nil {
		// The API server checks it as it would the create (a name taken, its
		// rules), keeping nothing.
		dryRun = append(dryRun, client.DryRunAll)
	}
	if err := b.cfg.Client.Create(ctx, db, dryRun...); err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			old := &appv1.Database{}
			if gerr := b.cfg.Client.Get(ctx, b.key(req.Name), old); gerr == nil && !old.DeletionTimestamp.IsZero() {
				return nil, Errorf(Conflict, "a database named %s is still being deleted: try again in a moment", req.Name)
			}
			return nil, Errorf(Conflict, "a database named %s exists already: pick another name", req.Name)
		case apierrors.IsInvalid(err):
			return nil, Errorf(Invalid, "the API refused database %s: %s", req.Name, apierrors.ReasonForError(err))
		}
		return nil, fmt.Errorf("creating database %s: %w", req.Name, err)
	}
	if err := wouldChange(ctx, func(p *Plan) {
		in := databaseInfoOf(db, nil)
		p.Database = &in
		p.Changes = append(p.Changes, fmt.Sprintf("would create the %s database %s (%s, %d instances) with %s as its member", req.Engine, req.Name, size.String(), db.Spec.Instances, u.Name))
	}); err != nil {
		return nil, err
	}
	b.auditDatabase(u, string(req.Engine)+":create", req.Name, "size", size.String(), "version", req.Version, "instances", db.Spec.Instances)
	// The UID tells the new Database from an older one of the same name whose
	// deletion the cache may not have seen yet.
	if err := b.waitDatabaseCached(ctx, req.Name, func(c *appv1.Database) bool { return c != nil && c.UID == db.UID }); err != nil {
		return nil, err
	}
	in := databaseInfoOf(db, nil)
	return &in, nil
}

// DestroyDatabase deletes a database; confirm must be its name again. It is
// refused while apps are linked to it (their instances could not start again
// without its credentials). The deployer then stops its server and deletes its
// data and credentials.
func (b *Backend) DestroyDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, confirm string) error {
	// A database's end reaches past the apps of a limited token: every app
	// linked to it, every member.
	if err := u.mayChange(dbOp(engine, "destroy")); err != nil {
		return err
	}
	if err := u.unlimited(dbOp(engine, "destroy")); err != nil {
		return err
	}
	db, err := b.database(ctx, u, engine, name)
	if err != nil {
		return err
	}
	links, err := b.links(ctx, name)
	if err != nil {
		return err
	}
	if len(links) > 0 {
		return Errorf(Conflict, "%s is linked to %s: %s:unlink %s APP for each first", name, strings.Join(links, ", "), db.Spec.Engine, name)
	}
	if confirm != name {
		return Errorf(Invalid, "this deletes the database %s and its data for good: to go on, run %s:destroy %s --confirm %s", name, db.Spec.Engine, name, name)
	}
	// The UID: a database made again under the name meanwhile is another one.
	err = b.cfg.Client.Delete(ctx, db, client.Preconditions{UID: &db.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			return Errorf(Conflict, "%s changed meanwhile: try again", name)
		}
		return fmt.Errorf("deleting database %s: %w", name, err)
	}
	b.auditDatabase(u, string(db.Spec.Engine)+":destroy", name)
	// Its backups go with it (the schedule's sweep removes what this misses:
	// a database deleted with kubectl, a capture that ended meanwhile).
	if b.cfg.Backups != nil {
		if err := b.cfg.Backups.Remove(string(db.UID)); err != nil {
			b.log.Error("removing the backups of a destroyed database", "database", name, "err", err)
		}
	}
	return nil
}

// credentialVar is the config var named as whose value is the url key of the
// credentials of the database named name.
func credentialVar(as, name string) appv1.EnvVar {
	return appv1.EnvVar{Name: as, ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret(name), Key: appv1.CredentialURL}}
}

// fromDatabase reports whether e takes its value from the credentials of the
// database named name.
func fromDatabase(e appv1.EnvVar, name string) bool {
	return e.ValueFrom != nil && e.ValueFrom.Name == appv1.CredentialsSecret(name)
}

// LinkDatabase gives app a config var (as; empty: DATABASE_URL or REDIS_URL)
// whose value is the URL in the database's credentials, as a reference to
// their Secret: one release, which restarts the app with it (before the first
// deploy the spec keeps it). A var of that name set otherwise is refused, not
// replaced. Await the release with Await.
func (b *Backend) LinkDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, app, as string, progress io.Writer) (*LinkResult, error) {
	if err := u.mayChange(dbOp(engine, "link")); err != nil {
		return nil, err
	}
	db, err := b.database(ctx, u, engine, name)
	if err != nil {
		return nil, err
	}
	if as == "" {
		as = appv1.LinkEnv(db.Spec.Engine)
	}
	if err := checkEnvName(as); err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, app)
	if err != nil {
		return nil, err
	}
	if !db.DeletionTimestamp.IsZero() {
		return nil, Errorf(Conflict, "the database %s is being deleted", name)
	}
	if db.Status.Host == "" {
		// Its credentials are made with its address: a link before them would
		// keep the app's new instances from starting.
		return nil, Errorf(Conflict, "the database %s is not made yet (%s): link it once %s:info %s shows its host", name, databaseInfoOf(db, nil).Status, db.Spec.Engine, name)
	}
	res := &LinkResult{Database: name, App: a.Name, Vars: []string{as}}
	want := credentialVar(as, name)
	if i := slices.IndexFunc(a.Spec.Env, func(e appv1.EnvVar) bool { return e.Name == as }); i >= 0 {
		e := a.Spec.Env[i]
		if e.ValueFrom != nil && *e.ValueFrom == *want.ValueFrom {
			return res, nil // linked so already
		}
		return nil, Errorf(Conflict, "%s has a config var %s already: link with --as ANOTHER_NAME, or config:unset %s %s first", a.Name, as, a.Name, as)
	}
	res.Description = fmt.Sprintf("Link %s as %s", name, as)
	edit := func(env []appv1.EnvVar) []appv1.EnvVar {
		// On the App as read for the write: a var of the name set since is
		// replaced by the link that was asked for last.
		env = slices.DeleteFunc(env, func(e appv1.EnvVar) bool { return e.Name == as })
		return append(env, want)
	}
	n, err := b.recordConfig(ctx, u, a, string(db.Spec.Engine)+":link", res.Description, edit, progress, "database", name, "var", as)
	if err != nil {
		return nil, err
	}
	res.Release = n
	return res, nil
}

// UnlinkDatabase removes every config var of app that takes its value from
// the database's credentials: one release, as LinkDatabase's.
func (b *Backend) UnlinkDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, app string, progress io.Writer) (*LinkResult, error) {
	if err := u.mayChange(dbOp(engine, "unlink")); err != nil {
		return nil, err
	}
	db, err := b.database(ctx, u, engine, name)
	if err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, app)
	if err != nil {
		return nil, err
	}
	res := &LinkResult{Database: name, App: a.Name, Vars: []string{}}
	for _, e := range a.Spec.Env {
		if fromDatabase(e, name) {
			res.Vars = append(res.Vars, e.Name)
		}
	}
	if len(res.Vars) == 0 {
		return nil, Errorf(NotFound, "%s is not linked to %s: no config var of it comes from %s", a.Name, name, name)
	}
	res.Description = fmt.Sprintf("Unlink %s (%s)", name, strings.Join(res.Vars, ", "))
	edit := func(env []appv1.EnvVar) []appv1.EnvVar {
		return slices.DeleteFunc(env, func(e appv1.EnvVar) bool { return fromDatabase(e, name) })
	}
	n, err := b.recordConfig(ctx, u, a, string(db.Spec.Engine)+":unlink", res.Description, edit, progress, "database", name, "vars", res.Vars)
	if err != nil {
		return nil, err
	}
	res.Release = n
	return res, nil
}

// The shell lines of the databases' one-offs. The URL comes from the
// environment (a reference to the credentials Secret, resolved by the
// runtime), never from the command line the backend logs.
const (
	// psql stops a script at its first error, with a non-zero exit status.
	psqlScript = `exec psql -v ON_ERROR_STOP=1 "$DATABASE_URL"`
	// pg_dump's custom format, which pg_restore reads.
	backupScript = `exec pg_dump --format=custom "$DATABASE_URL"`
	// One transaction that stops at the first error: a restore that fails
	// leaves the data as it was. Objects are dropped first (--clean
	// --if-exists), and owners and grants of the dump's source are not
	// applied: the database's own user owns what it restores.
	restoreScript = `exec pg_restore --clean --if-exists --no-owner --no-acl --single-transaction --exit-on-error --dbname "$DATABASE_URL"`
	// The URL carries the password: the warning about that is redis-cli's
	// for a password typed on a command line, which this is not.
	redisCLIScript = `exec redis-cli --no-auth-warning -u "$REDIS_URL"`
)

// DatabaseShell runs the engine's client on the database (psql, redis-cli):
// interactive on a terminal, else reading commands from Stdin. It returns the
// client's exit status.
func (b *Backend) DatabaseShell(ctx context.Context, u *User, engine appv1.DatabaseEngine, name string, dio DatabaseIO) (int, error) {
	// psql and redis-cli write as readily as they read.
	if err := u.mayChange("postgres:psql and redis:cli"); err != nil {
		return 0, err
	}
	if err := checkEngine(engine); err != nil {
		return 0, err
	}
	op, script := "postgres:psql", psqlScript
	if engine == appv1.EngineRedis {
		op, script = "redis:cli", redisCLIScript
	}
	return b.runDatabase(ctx, u, engine, name, op, script, dio)
}

// BackupDatabase writes a dump of a Postgres database to w in pg_dump's
// custom format; pg_dump's messages go to errOut.
func (b *Backend) BackupDatabase(ctx context.Context, u *User, name string, w, errOut io.Writer) error {
	exit, err := b.runDatabase(ctx, u, appv1.EnginePostgres, name, "postgres:backup", backupScript, DatabaseIO{Stdout: w, Stderr: errOut})
	if err != nil {
		return err
	}
	if exit != 0 {
		return Errorf(Failed, "postgres:backup %s: pg_dump exited with %d: the dump is not whole", name, exit)
	}
	return nil
}

// RestoreDatabase replaces a Postgres database's contents with the dump read
// from r (postgres:backup's), in one transaction: when it fails, the data is
// as it was. pg_restore's messages go to errOut.
func (b *Backend) RestoreDatabase(ctx context.Context, u *User, name string, r io.Reader, errOut io.Writer) error {
	if err := u.mayChange("postgres:restore"); err != nil {
		return err
	}
	exit, err := b.runDatabase(ctx, u, appv1.EnginePostgres, name, "postgres:restore", restoreScript, DatabaseIO{Stdin: r, Stdout: errOut, Stderr: errOut})
	if err != nil {
		return err
	}
	if exit != 0 {
		return Errorf(Failed, "postgres:restore %s: pg_restore exited with %d, and nothing was restored: the data is as it was", name, exit)
	}
	return nil
}

// runDatabase runs script (sh -c) in a one-off from the database's image,
// with its URL in the environment (DATABASE_URL or REDIS_URL, a reference to
// its credentials Secret: the runtime gives a one-off whose env takes from a
// database's Secret the reach of that database, as it does a linked app's
// instances). It runs as the deployer runs the server: a synthetic App of the
// runtime name, the Database's UID and its label.
func (b *Backend) runDatabase(ctx context.Context, u *User, engine appv1.DatabaseEngine, name, op, script string, dio DatabaseIO) (int, error) {
	db, err := b.database(ctx, u, engine, name)
	if err != nil {
		return 0, err
	}
	return b.runOnDatabase(ctx, db, op, script, dio, func(id string) { b.auditDatabase(u, op, name, "id", id, "tty", dio.TTY != nil) })
}

// runOnDatabase runs script on db, which the caller may use; audit records
// the run (by its ID) once it is allowed to start.
func (b *Backend) runOnDatabase(ctx context.Context, db *appv1.Database, op, script string, dio DatabaseIO, audit func(id string)) (int, error) {
	name, engine := db.Name, db.Spec.Engine
	if b.cfg.Runner == nil {
		return 0, Errorf(Invalid, "this server cannot run one-off commands")
	}
	if st := databaseInfoOf(db, nil); st.Status != string(appv1.DatabaseRunning) || db.Status.Image == "" {
		why := st.Status
		if st.Message != "" {
			why += ": " + st.Message
		}
		return 0, Errorf(Conflict, "the database %s is not running (%s): %s:info %s says when it is", name, why, engine, name)
	}
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: db.Namespace, Name: appv1.RuntimeName(db.Name), UID: db.UID,
		Labels: map[string]string{appv1.LabelDatabase: db.Name}}}
	spec := RunSpec{App: app, ID: newRunID(), Release: 1, Image: db.Status.Image,
		Command: []string{"sh", "-c", script}, Env: []appv1.EnvVar{credentialVar(appv1.LinkEnv(engine), db.Name)},
		Stdin: dio.Stdin, Stdout: dio.Stdout, Stderr: dio.Stderr, TTY: dio.TTY}
	spec.Process = "run." + spec.ID
	return b.runOneOff(ctx, op, name, app.Name, spec, false, func() { audit(spec.ID) })
}

// auditDatabase logs a change of, or a session on, a database.
func (b *Backend) auditDatabase(u *User, op, name string, attrs ...any) {
	b.log.Info("audit", append([]any{"user", u.Name, "key", u.KeyName, "fingerprint", u.KeyFingerprint, "command", op, "database", name}, attrs...)...)
}

// waitDatabaseCached waits until the cached database satisfies done (nil:
// gone), for at most CacheWait, as waitCached does for apps.
func (b *Backend) waitDatabaseCached(ctx context.Context, name string, done func(*appv1.Database) bool) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.CacheWait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		db := &appv1.Database{}
		err := b.cfg.Reader.Get(ctx, b.key(name), db)
		switch {
		case apierrors.IsNotFound(err):
			if done(nil) {
				return nil
			}
		case err == nil:
			if done(db) {
				return nil
			}
		case ctx.Err() == nil:
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the change of database %s was made, but this server's cache has not seen it yet: the next command may not show it (%w)", name, errors.Join(ErrNotCached, ctx.Err()))
		case <-tick.C:
		}
	}
}
