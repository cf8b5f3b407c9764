package backend_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// TestSessionUsesRecordDatabases: the databases a request reads for its user
// are recorded in its Uses, apart from its apps (an app may have a database's
// name), and only once the access check passed; the recheck reads them again
// and says in one line why the request ends.
func TestSessionUsesRecordDatabases(t *testing.T) {
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner = &dbRunner{} },
		app("shop", "bob"), database("shop", appv1.EnginePostgres, appv1.DatabaseRunning, "bob"), credentials("shop"),
		database("cache", appv1.EngineRedis, appv1.DatabaseRunning, "bob"),
		database("theirs", appv1.EnginePostgres, appv1.DatabaseRunning, "carol"))
	bob := &backend.User{Name: "bob"}
	us := &backend.Uses{}
	ctx := backend.WithUses(context.Background(), us)

	// Refused reads record nothing: a database of another's, one of the other
	// engine, one that does not exist.
	for _, name := range []string{"theirs", "cache", "nowhere"} {
		if _, err := f.b.Database(ctx, bob, appv1.EnginePostgres, name); backend.KindOf(err) != backend.NotFound {
			t.Errorf("postgres:info %s: %v", name, err)
		}
	}
	if got := us.Databases(); len(got) != 0 {
		t.Fatalf("refused reads recorded %v", got)
	}

	// psql, info and again info: each database once, in the order first used.
	if _, err := f.b.DatabaseShell(ctx, bob, appv1.EnginePostgres, "shop", backend.DatabaseIO{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cache", "shop"} {
		if _, err := f.b.Database(ctx, bob, "", name); err != nil {
			t.Fatal(err)
		}
	}
	if got := us.Databases(); !slices.Equal(got, []string{"shop", "cache"}) {
		t.Errorf("databases recorded: %v", got)
	}
	if got := us.Apps(); len(got) != 0 {
		t.Errorf("a database's operations recorded the apps %v", got)
	}

	// The recheck's read and rule.
	shop, err := f.b.CachedDatabase(ctx, "shop")
	if err != nil || shop == nil {
		t.Fatalf("CachedDatabase shop: %v, %v", shop, err)
	}
	if err := backend.StillMayUseDatabase(bob, bob, "shop", shop.Spec.Members); err != nil {
		t.Errorf("bob, still a member of shop: %v", err)
	}
	if gone, err := f.b.CachedDatabase(ctx, "nowhere"); gone != nil || err != nil {
		t.Errorf("CachedDatabase of a database that is gone: %v, %v", gone, err)
	}
	wantKind(t, "a member taken off", backend.StillMayUseDatabase(bob, bob, "shop", []string{"carol"}),
		backend.Forbidden, "your access to the database shop was removed: this session ends")
	wantKind(t, "an admin demoted", backend.StillMayUseDatabase(&backend.User{Name: "bob", Admin: true}, bob, "theirs", []string{"carol"}),
		backend.Forbidden, "bob is no longer an admin, and not a member of the database theirs: this session ends")
}
