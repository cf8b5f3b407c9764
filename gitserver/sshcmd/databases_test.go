package sshcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/dbbackups"
	"bex.co/bex/internal/testenv"
)

// dbPassword is the password in the test databases' credentials Secret: no
// command may print it.
const dbPassword = "pw-Zx8vQ1mR4tL0"

// runDatabase plays the deployer's part for a database: its status once its
// server runs, and its credentials Secret.
func (s *server) runDatabase(ctx context.Context, name string) {
	s.t.Helper()
	db := &appv1.Database{}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, db); err != nil {
		s.t.Fatal(err)
	}
	db.Status = appv1.DatabaseStatus{Phase: appv1.DatabaseRunning, Host: "127.0.0.1", Port: 15432, Version: "16.4",
		Image: "bex.local/" + string(db.Spec.Engine) + "@sha256:" + strings.Repeat("c", 64), UsedBytes: 8 << 20}
	if err := s.cp.Client.Status().Update(ctx, db); err != nil {
		s.t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: appv1.CredentialsSecret(name), Namespace: s.ns, Labels: map[string]string{appv1.LabelDatabase: name}},
		Data: map[string][]byte{appv1.CredentialPassword: []byte(dbPassword), appv1.CredentialURL: []byte("postgres://u:" + dbPassword + "@127.0.0.1:15432/u")}}
	if err := s.cp.Client.Create(ctx, secret); err != nil {
		s.t.Fatal(err)
	}
}

// TestDatabasesOverSSH: postgres:* and redis:* through the real ssh client and
// a real API server (the Database CRD's own validation included): a member's
// databases, their links (a reference to the credentials, in one release that
// the command waits for), their destruction, and a non-member's lines, the
// same as for a database that does not exist.
func TestDatabasesOverSSH(t *testing.T) {
	s := newServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)

	if out := bob.ok(""); !strings.Contains(out, "Databases (Postgres, Redis):") || !strings.Contains(out, "postgres:psql") || !strings.Contains(out, "redis:cli") {
		t.Fatalf("help lists no databases:\n%s", out)
	}

	out := bob.ok("", "postgres:create", "shop", "--size", "256Mi")
	if !strings.Contains(out, "Creating the Postgres database shop (256Mi)") || !strings.Contains(out, "postgres:link shop APP gives an app its DATABASE_URL") {
		t.Fatalf("postgres:create:\n%s", out)
	}
	bob.ok("", "redis:create", "cache", "--memory", "64Mi")
	carol.ok("", "postgres:create", "theirs")
	bob.refused("a database named shop exists already", "redis:create", "shop")
	bob.refused(`--size "1Ki": give a size from 16Mi to 16Ti`, "postgres:create", "tiny", "--size", "1Ki")
	bob.refused(`"Bad_Name" is not a database name`, "postgres:create", "Bad_Name")

	var dbs []backend.DatabaseInfo
	bob.json(&dbs, "postgres:list")
	if len(dbs) != 1 || dbs[0].Name != "shop" || dbs[0].Engine != "postgres" || dbs[0].Status != "Pending" || dbs[0].Size != "256Mi" || dbs[0].Members[0] != bob.name {
		t.Fatalf("bob's postgres:list: %+v", dbs)
	}
	bob.json(&dbs, "redis:list")
	if len(dbs) != 1 || dbs[0].Name != "cache" || dbs[0].Memory != "64Mi" {
		t.Fatalf("bob's redis:list: %+v", dbs)
	}
	admin.json(&dbs, "postgres:list")
	if len(dbs) != 2 {
		t.Fatalf("the admin's postgres:list: %+v", dbs)
	}

	s.runDatabase(ctx, "shop")
	s.runDatabase(ctx, "cache")
	var in backend.DatabaseInfo
	s.eventually(func() error {
		bob.json(&in, "postgres:info", "shop")
		if in.Status != "Running" {
			return fmt.Errorf("shop is %s", in.Status)
		}
		return nil
	})
	if in.Port != 15432 || in.Host != "127.0.0.1" || in.Database != "shop" || in.User != "shop" || in.UsedBytes == nil || *in.UsedBytes != 8<<20 {
		t.Errorf("postgres:info shop --json: %+v", in)
	}
	text := bob.ok("", "postgres:info", "shop")
	for _, w := range []string{"Status:", "Running", "Port:", "15432", "Database:", "shop", "Used:", "8.0 MiB"} {
		if !strings.Contains(text, w) {
			t.Errorf("postgres:info lacks %q:\n%s", w, text)
		}
	}

	// The app, deployed, with a deployer that serves its releases.
	bob.ok("", "apps:create", "notes")
	a := s.app("notes")
	a.Spec.Image = "bex.local/notes@sha256:" + strings.Repeat("b", 64)
	if err := s.cp.Client.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	testenv.StartFakeDeployer(ctx, t, s.cp.Client, s.ns)
	s.eventually(func() error {
		if s.app("notes").Spec.Image == "" {
			return errors.New("no image yet")
		}
		return nil
	})

	// A non-member is told what an unknown database would tell; so for each
	// command that names one.
	for _, args := range [][]string{
		{"postgres:info", "%s"}, {"postgres:link", "%s", "notes"}, {"postgres:unlink", "%s", "notes"},
		{"postgres:psql", "%s"}, {"postgres:backup", "%s"}, {"postgres:destroy", "%s", "--confirm", "%s"},
	} {
		line := func(u *sshUser, name string) string {
			words := make([]string, len(args))
			for i, w := range args {
				words[i] = strings.ReplaceAll(w, "%s", name)
			}
			_, errOut, code := u.ssh("", words...)
			if code == 0 || strings.Count(errOut, "\n") != 1 {
				t.Errorf("%s %v: exit %d, %q", u.name, words, code, errOut)
			}
			return errOut
		}
		hidden, unknown := line(carol, "shop"), line(carol, "shoq")
		if !strings.Contains(hidden, `no postgres database "shop"`) || strings.ReplaceAll(unknown, "shoq", "shop") != hidden {
			t.Errorf("%v: another's database says %q, an unknown one %q", args, hidden, unknown)
		}
	}
	carol.json(&dbs, "postgres:list")
	if len(dbs) != 1 || dbs[0].Name != "theirs" {
		t.Errorf("carol's postgres:list: %+v", dbs)
	}
	bob.refused("cache is a redis database, not a postgres one: redis:info cache shows it", "postgres:info", "cache")
	bob.refused(`"Bad_Name" is not a database name`, "postgres:info", "Bad_Name")
	bob.refused(`no app "zzz"`, "postgres:link", "shop", "zzz")
	carol.refused("has no access to app notes", "postgres:link", "theirs", "notes")

	// link: one release, waited for; the Secret named, its value nowhere.
	out = bob.ok("", "postgres:link", "shop", "notes")
	if !strings.Contains(out, "Linked shop to notes as DATABASE_URL: release v1.") || !strings.Contains(out, "v1 serves at") {
		t.Fatalf("postgres:link:\n%s", out)
	}
	out = bob.ok("", "redis:link", "cache", "notes", "--as", "CACHE_URL")
	if !strings.Contains(out, "Linked cache to notes as CACHE_URL: release v2.") {
		t.Fatalf("redis:link --as:\n%s", out)
	}
	config := bob.ok("", "config", "notes")
	if !strings.Contains(config, "DATABASE_URL  # from secret bex-db-shop, key url") || !strings.Contains(config, "CACHE_URL  # from secret bex-db-cache, key url") {
		t.Errorf("config notes:\n%s", config)
	}
	rel := &appv1.Release{}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "notes-v1"}, rel); err != nil {
		t.Fatal(err)
	}
	if env := rel.Spec.Config.Env; len(env) != 1 || env[0].Value != "" || env[0].ValueFrom == nil || env[0].ValueFrom.Name != "bex-db-shop" ||
		rel.Spec.Description != "Link shop as DATABASE_URL" || rel.Spec.Actor != bob.name {
		t.Errorf("release v1: %+v", rel.Spec)
	}
	// The commands read apps from the server's cache, which follows the
	// API server's writes a moment later.
	var ai backend.AppInfo
	s.eventually(func() error {
		bob.json(&ai, "apps:info", "notes")
		if strings.Join(ai.Databases, ",") != "cache,shop" {
			return fmt.Errorf("apps:info notes --json names the databases %v", ai.Databases)
		}
		return nil
	})
	if out := bob.ok("", "postgres:link", "shop", "notes"); !strings.Contains(out, "notes has DATABASE_URL from shop already: nothing to change.") {
		t.Errorf("the same link again:\n%s", out)
	}
	s.eventually(func() error {
		bob.json(&in, "postgres:info", "shop")
		if strings.Join(in.Links, ",") != "notes" {
			return fmt.Errorf("links %v", in.Links)
		}
		return nil
	})
	for _, shown := range []string{config, bob.ok("", "postgres:info", "shop"), bob.ok("", "postgres:info", "shop", "--json"), bob.ok("", "postgres:list"), bob.ok("", "apps:info", "notes", "--json")} {
		if strings.Contains(shown, dbPassword) {
			t.Errorf("the password is shown:\n%s", shown)
		}
	}

	// destroy: refused while linked, naming the app; then gone.
	bob.refused("shop is linked to notes: postgres:unlink shop APP for each first", "postgres:destroy", "shop", "--confirm", "shop")
	out = bob.ok("", "postgres:unlink", "shop", "notes")
	if !strings.Contains(out, "Unlinked shop from notes (DATABASE_URL): release v3.") || !strings.Contains(out, "v3 serves at") {
		t.Fatalf("postgres:unlink:\n%s", out)
	}
	if env := s.app("notes").Spec.Env; len(env) != 1 || env[0].Name != "CACHE_URL" {
		t.Errorf("notes' env after the unlink: %+v", env)
	}
	s.eventually(func() error {
		bob.json(&in, "postgres:info", "shop")
		if len(in.Links) != 0 {
			return fmt.Errorf("links %v", in.Links)
		}
		return nil
	})
	bob.refused("notes is not linked to shop", "postgres:unlink", "shop", "notes")
	bob.refused("run postgres:destroy shop --confirm shop", "postgres:destroy", "shop")
	if out := bob.ok("", "postgres:destroy", "shop", "--confirm", "shop"); !strings.Contains(out, "Destroyed shop") {
		t.Fatalf("postgres:destroy:\n%s", out)
	}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "shop"}, &appv1.Database{}); !apierrors.IsNotFound(err) {
		t.Errorf("shop after postgres:destroy: %v", err)
	}
	bob.refused("cache is linked to notes: redis:unlink cache APP", "redis:destroy", "cache", "--confirm", "cache")
	bob.ok("", "redis:unlink", "cache", "notes", "--detach")
	s.eventually(func() error {
		if _, errOut, code := bob.ssh("", "redis:destroy", "cache", "--confirm", "cache"); code != 0 {
			return errors.New(errOut)
		}
		return nil
	})

	log := s.log.String()
	for _, w := range []string{"command=postgres:create backend.database=shop", "command=postgres:link backend.app=notes backend.database=shop",
		"command=redis:destroy backend.database=cache", "backend.user=" + bob.name} {
		if !strings.Contains(log, w) {
			t.Errorf("the log lacks %q", w)
		}
	}
}

// TestDatabaseOneOffCommands: psql, backup, restore and redis:cli hand the
// session's streams (and terminal) to the one-off, and pass its exit status.
func TestDatabaseOneOffCommands(t *testing.T) {
	r := &fakeRunner{}
	running := func(name string, engine appv1.DatabaseEngine, members ...string) *appv1.Database {
		return &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
			Spec: appv1.DatabaseSpec{Engine: engine, Size: resource.MustParse("1Gi"), Members: members},
			Status: appv1.DatabaseStatus{Phase: appv1.DatabaseRunning, Host: "127.0.0.1", Port: 15432,
				Image: "bex.local/" + string(engine) + "@sha256:" + strings.Repeat("c", 64)}}
	}
	early := running("early", appv1.EnginePostgres, "bob")
	early.Status = appv1.DatabaseStatus{Phase: appv1.DatabaseCreating}
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner = r },
		running("shop", appv1.EnginePostgres, "bob"), running("cache", appv1.EngineRedis, "bob"), early)

	out, errOut, code := f.run(bob, "SELECT 1;\n", "postgres:psql", "shop")
	if code != 0 || out != "SELECT 1;\n" || errOut != "" || len(r.runs) != 1 || !strings.Contains(r.runs[0].Command[2], "psql") || r.runs[0].App.Name != "shop.db" {
		t.Fatalf("postgres:psql: %d %q %q %+v", code, out, errOut, r.runs)
	}
	// On a terminal, interactive: the terminal passes, one output stream.
	var o bytes.Buffer
	code = f.cmds.Run(context.Background(), gitserver.CommandSession{User: bob, KeyFingerprint: "SHA256:test",
		Args: []string{"redis:cli", "cache"}, Stdin: strings.NewReader(""), Stdout: &o, Stderr: io.Discard,
		TTY: &backend.TTY{Term: "xterm-256color", Width: 100, Height: 30}})
	if code != 0 || o.String() != "30 100 xterm-256color\n" || !strings.Contains(r.runs[1].Command[2], "redis-cli") || r.runs[1].Env[0].Name != "REDIS_URL" {
		t.Fatalf("redis:cli on a terminal: %d %q %+v", code, o.String(), r.runs[1])
	}
	// A dump from stdin reaches pg_restore; what it says goes to stderr.
	out, errOut, code = f.run(bob, "PGDMP dump", "postgres:restore", "shop")
	if code != 0 || out != "Restored shop from the dump.\n" || errOut != "PGDMP dump" || !strings.Contains(r.runs[2].Command[2], "pg_restore") {
		t.Fatalf("postgres:restore: %d %q %q", code, out, errOut)
	}
	// A backup writes nothing of bex's own to stdout: the dump alone.
	out, errOut, code = f.run(bob, "", "postgres:backup", "shop")
	if code != 0 || out != "" || errOut != "" || !strings.Contains(r.runs[3].Command[2], "pg_dump") || r.runs[3].Stdin != nil {
		t.Fatalf("postgres:backup: %d %q %q", code, out, errOut)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"postgres:psql", "early"}, "the database early is not running (Creating): postgres:info early says when it is"},
		{[]string{"postgres:psql", "cache"}, "cache is a redis database"},
		{[]string{"redis:cli", "shop"}, "shop is a postgres database"},
		{[]string{"postgres:psql"}, "usage: postgres:psql NAME"},
		{[]string{"redis:backup", "cache"}, `unknown command "redis:backup"`},
	} {
		_, errOut, code := f.run(bob, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: %d %q, want %q", c.args, code, errOut, c.want)
		}
	}
	if len(r.runs) != 4 {
		t.Errorf("refused one-offs reached the runner: %d runs", len(r.runs))
	}
	out, _, _ = f.run(bob, "", "postgres:list", "--json")
	var dbs []backend.DatabaseInfo
	if err := json.Unmarshal([]byte(out), &dbs); err != nil || len(dbs) != 2 {
		t.Errorf("postgres:list --json: %v %s", err, out)
	}
}

// TestDatabaseBackupCommands: postgres:backups:capture keeps a dump on the
// server, postgres:backups lists it with the schedule, and postgres:restore
// --backup feeds it to pg_restore.
func TestDatabaseBackupCommands(t *testing.T) {
	r := &fakeRunner{}
	store := &dbbackups.Store{Dir: t.TempDir()}
	shop := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: ns, UID: types.UID("0b7f3c1e-2a4d-4f6e-9c8b-1d2e3f4a5b6c")},
		Spec: appv1.DatabaseSpec{Engine: appv1.EnginePostgres, Size: resource.MustParse("1Gi"), Members: []string{"bob"}},
		Status: appv1.DatabaseStatus{Phase: appv1.DatabaseRunning, Host: "127.0.0.1", Port: 15432,
			Image: "bex.local/postgres@sha256:" + strings.Repeat("c", 64)}}
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner, c.Backups = r, store }, shop)

	out, errOut, code := f.run(bob, "", "postgres:backups", "shop")
	if code != 0 || !strings.Contains(out, "Schedule: @daily (UTC), 7 kept; next: ") || !strings.Contains(out, "No backups yet: postgres:backups:capture shop takes one now.") {
		t.Fatalf("postgres:backups of a new database: %d %q %q", code, out, errOut)
	}
	out, errOut, code = f.run(bob, "", "postgres:backups:capture", "shop", "--json")
	var bk dbbackups.Backup
	if code != 0 || json.Unmarshal([]byte(out), &bk) != nil || bk.Kind != dbbackups.Captured || !dbbackups.ValidID(bk.ID) {
		t.Fatalf("postgres:backups:capture --json: %d %q %q", code, out, errOut)
	}
	if !strings.Contains(r.runs[0].Command[2], "pg_dump") {
		t.Fatalf("the capture ran %q", r.runs[0].Command)
	}
	out, _, code = f.run(bob, "", "postgres:backups", "shop")
	if code != 0 || !strings.Contains(out, bk.ID) || !strings.Contains(out, "captured") {
		t.Fatalf("postgres:backups after a capture: %d %q", code, out)
	}
	out, errOut, code = f.run(bob, "", "postgres:restore", "shop", "--backup", bk.ID)
	if code != 0 || out != "Restored shop from its backup "+bk.ID+".\n" || !strings.Contains(r.runs[1].Command[2], "pg_restore") || r.runs[1].Stdin == nil {
		t.Fatalf("postgres:restore --backup: %d %q %q", code, out, errOut)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"postgres:restore", "shop", "--backup", "../x"}, `shop has no backup "../x": postgres:backups shop lists them`},
		{[]string{"postgres:backups", "nope"}, `no postgres database "nope"`},
		{[]string{"redis:backups", "shop"}, `unknown command "redis:backups"`},
	} {
		_, errOut, code := f.run(bob, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: %d %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// TestDatabaseAccessOverSSH: postgres:access:* and redis:access:* through the
// real ssh client on a real API server: a member added lists, reads and links
// the database at once; removed, it is an unknown name to them again; a
// non-member cannot add themselves; USER must exist; a database of the other
// engine is an unknown name.
func TestDatabaseAccessOverSSH(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)

	if out := bob.ok(""); !strings.Contains(out, "postgres:access:add") || !strings.Contains(out, "redis:access:remove") {
		t.Fatalf("help lists no database access commands:\n%s", out)
	}
	if out := bob.ok("", "help", "redis:access:add"); !strings.Contains(out, "redis:access:add NAME USER") {
		t.Fatalf("help redis:access:add:\n%s", out)
	}
	bob.ok("", "postgres:create", "shop")
	bob.ok("", "redis:create", "cache")
	s.runDatabase(ctx, "shop")
	s.runDatabase(ctx, "cache")
	s.eventually(func() error {
		var in backend.DatabaseInfo
		bob.json(&in, "postgres:info", "shop")
		if in.Status != "Running" {
			return fmt.Errorf("shop is %s", in.Status)
		}
		return nil
	})

	// The same line as an unknown name: a non-member, and the other engine.
	line := func(u *sshUser, args ...string) string {
		t.Helper()
		out, errOut, code := u.ssh("", args...)
		if code == 0 || out != "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s %v: exit %d, stdout %q, stderr %q", u.name, args, code, out, errOut)
		}
		return errOut
	}
	for _, c := range []struct {
		u    *sshUser
		args []string
	}{
		{carol, []string{"postgres:access:add", "%s", carol.name}},
		{carol, []string{"postgres:access:list", "%s"}},
		{carol, []string{"postgres:access:remove", "%s", bob.name}},
		{bob, []string{"redis:access:add", "%s", carol.name}},
	} {
		words := func(name string) []string {
			out := make([]string, len(c.args))
			for i, w := range c.args {
				out[i] = strings.ReplaceAll(w, "%s", name)
			}
			return out
		}
		hidden, unknown := line(c.u, words("shop")...), line(c.u, words("shoq")...)
		if !strings.Contains(hidden, `database "shop"`) || strings.ReplaceAll(unknown, "shoq", "shop") != hidden {
			t.Errorf("%s %v: shop says %q, an unknown name %q", c.u.name, c.args, hidden, unknown)
		}
	}
	for _, args := range [][]string{{"postgres:access:list", "%s"}, {"postgres:access:add", "%s", carol.name}, {"postgres:access:remove", "%s", bob.name}} {
		cache, unknown := line(bob, strings.ReplaceAll(strings.Join(args, " "), "%s", "cache")), line(bob, strings.ReplaceAll(strings.Join(args, " "), "%s", "cachx"))
		if !strings.Contains(cache, `no postgres database "cache"`) || strings.ReplaceAll(unknown, "cachx", "cache") != cache {
			t.Errorf("%v on a redis database says %q, on an unknown name %q", args, cache, unknown)
		}
	}
	if out := bob.ok("", "postgres:access:list", "shop"); out != bob.name+"\n" {
		t.Fatalf("postgres:access:list shop: %q", out)
	}
	bob.refused(`no user "nobody": an admin creates users with users:add`, "postgres:access:add", "shop", "nobody")
	bob.refused("usage: postgres:access:add NAME USER", "postgres:access:add", "shop")

	// Added, carol lists, reads and links shop at once.
	if out := bob.ok("", "postgres:access:add", "shop", carol.name); out != carol.name+" may now use shop.\n" {
		t.Fatalf("postgres:access:add: %q", out)
	}
	var al backend.DatabaseAccess
	carol.json(&al, "postgres:access:list", "shop")
	if al.Database != "shop" || al.Engine != "postgres" || strings.Join(al.Members, ",") != bob.name+","+carol.name {
		t.Errorf("postgres:access:list --json: %+v", al)
	}
	var dbs []backend.DatabaseInfo
	carol.json(&dbs, "postgres:list")
	if len(dbs) != 1 || dbs[0].Name != "shop" {
		t.Errorf("carol's postgres:list: %+v", dbs)
	}
	if out := carol.ok("", "postgres:info", "shop"); !strings.Contains(out, "Running") || !strings.Contains(out, carol.name) {
		t.Errorf("carol's postgres:info shop:\n%s", out)
	}
	carol.ok("", "apps:create", "board")
	if out := carol.ok("", "postgres:link", "shop", "board"); !strings.Contains(out, "Linked shop to board as DATABASE_URL; the first deploy (git push) takes it.") {
		t.Errorf("carol's postgres:link:\n%s", out)
	}
	bob.refused(carol.name+" has access to shop already", "postgres:access:add", "shop", carol.name)

	// Removed, shop is an unknown name to her again.
	if out := bob.ok("", "postgres:access:remove", "shop", carol.name); out != carol.name+" may no longer use shop.\n" {
		t.Fatalf("postgres:access:remove: %q", out)
	}
	for _, args := range [][]string{{"postgres:info", "%s"}, {"postgres:access:add", "%s", carol.name}, {"postgres:unlink", "%s", "board"}} {
		hidden := line(carol, strings.ReplaceAll(strings.Join(args, " "), "%s", "shop"))
		unknown := line(carol, strings.ReplaceAll(strings.Join(args, " "), "%s", "shoq"))
		if !strings.Contains(hidden, `no postgres database "shop"`) || strings.ReplaceAll(unknown, "shoq", "shop") != hidden {
			t.Errorf("%v after the removal says %q, on an unknown name %q", args, hidden, unknown)
		}
	}
	bob.refused(carol.name+" is not a member of shop (postgres:access:list shop shows who is)", "postgres:access:remove", "shop", carol.name)

	// redis:access:*, and an admin leaving a database to admins.
	bob.ok("", "redis:access:add", "cache", carol.name)
	if out := carol.ok("", "redis:info", "cache"); !strings.Contains(out, "Running") {
		t.Errorf("carol's redis:info cache:\n%s", out)
	}
	admin.ok("", "redis:access:remove", "cache", bob.name)
	admin.ok("", "redis:access:remove", "cache", carol.name)
	if out := admin.ok("", "redis:access:list", "cache"); out != "Only admins may use cache.\n" {
		t.Errorf("redis:access:list of a database left to admins: %q", out)
	}
	bob.refused(`no redis database "cache"`, "redis:info", "cache")

	log := s.log.String()
	for _, w := range []string{"backend.user=" + bob.name, "command=postgres:access:add backend.database=shop backend.member=" + carol.name,
		"command=postgres:access:remove backend.database=shop backend.member=" + carol.name,
		"command=redis:access:add backend.database=cache backend.member=" + carol.name,
		"command=redis:access:remove backend.database=cache backend.member=" + bob.name} {
		if !strings.Contains(log, w) {
			t.Errorf("the log lacks %q", w)
		}
	}
}
