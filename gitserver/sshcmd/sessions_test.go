package sshcmd_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

// running is a real ssh client whose command is still going.
type running struct {
	cmd         *exec.Cmd
	out, errOut *testenv.SyncBuffer
	host        string
	done        chan struct{}
	code        int
}

// start runs args with the real ssh client and returns at once.
func (u *sshUser) start(args ...string) *running {
	u.s.t.Helper()
	r := &running{cmd: testenv.SSHCommand(u.key, "bex", u.s.addr, args...), out: &testenv.SyncBuffer{}, errOut: &testenv.SyncBuffer{}, done: make(chan struct{})}
	r.host, _, _ = strings.Cut(u.s.addr, ":")
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.errOut
	if err := r.cmd.Start(); err != nil {
		u.s.t.Fatal(err)
	}
	go func() {
		_ = r.cmd.Wait()
		r.code = r.cmd.ProcessState.ExitCode()
		close(r.done)
	}()
	u.s.t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
	})
	return r
}

// streaming waits until the session printed its first line (a log's, a
// database client's): the command runs, past its access check.
func (r *running) streaming(t *testing.T, app string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the logs session to stream", func() error {
		select {
		case <-r.done:
			t.Fatalf("the session on %s ended early: exit %d, %q", app, r.code, r.errOut.String())
		default:
		}
		if !strings.Contains(r.out.String(), "hello from "+app) {
			return fmt.Errorf("stdout so far %q", r.out.String())
		}
		return nil
	})
}

// endsWith waits up to 2 s (the promise) for the session to end with exactly
// one line on stderr containing one of wants and a failing status; it returns
// how long it took from since.
func (r *running) endsWith(t *testing.T, since time.Time, wants ...string) time.Duration {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(2*time.Second - time.Since(since)):
		t.Fatalf("the session is still open 2s after the change; stderr %q", r.errOut.String())
	}
	took := time.Since(since)
	// One line of bex's; the ssh client adds its own when the connection goes.
	errOut := r.errOut.String()
	errOut = strings.TrimSuffix(errOut, "Connection to "+r.host+" closed by remote host.\r\n")
	has := slices.ContainsFunc(wants, func(w string) bool { return strings.Contains(errOut, w) })
	if r.code == 0 || !has || strings.Count(strings.TrimLeft(errOut, "\n"), "\n") != 1 {
		t.Fatalf("the session ended with exit %d, stderr %q; want one line with one of %q", r.code, r.errOut.String(), wants)
	}
	return took
}

func (r *running) stillOpen(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.done:
		t.Fatalf("%s ended: exit %d, stderr %q", what, r.code, r.errOut.String())
	default:
	}
}

// TestWithdrawnAccessEndsOpenSessions: taking a user's access to an app away
// (access:remove), demoting an admin (the User's role edited, as with kubectl)
// and removing a user (users:remove) each end that user's open `logs -f` on the
// app within 2 s, with one line saying why, while the sessions of others on the
// app, and of the same user on another app, go on.
func TestWithdrawnAccessEndsOpenSessions(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, false)
	carol := s.addUser("carol", appv1.RoleMember, false)
	dave := s.addUser("dave", appv1.RoleAdmin, false)
	for name, members := range map[string][]string{"shop": {bob.name, carol.name}, "cart": {bob.name}} {
		if err := s.cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns}, Spec: appv1.AppSpec{Members: members}}); err != nil {
			t.Fatal(err)
		}
	}
	s.eventually(func() error { _, err := s.dir.App(ctx, "cart"); return err })
	s.eventually(func() error { _, err := s.dir.App(ctx, "shop"); return err })

	bobShop, bobCart := bob.start("logs", "shop", "-f"), bob.start("logs", "cart", "-f")
	carolShop, daveShop := carol.start("logs", "shop", "-f"), dave.start("logs", "shop", "-f")
	bobShop.streaming(t, "shop")
	bobCart.streaming(t, "cart")
	carolShop.streaming(t, "shop")
	daveShop.streaming(t, "shop")

	// The attack's premise: access:remove used to leave bob's stream running.
	admin.ok("", "access:remove", "shop", bob.name)
	took := bobShop.endsWith(t, time.Now(), "bex: your access to shop was removed: this session ends")
	t.Logf("access:remove ended bob's logs -f shop in %v", took.Round(time.Millisecond))
	// Bob is no longer let in either.
	bob.refused("has no access to app shop", "logs", "shop")

	// An admin demoted (no demote command: the User edited, as kubectl would)
	// loses the apps they are no member of.
	u := &appv1.User{}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Name: dave.name}, u); err != nil {
		t.Fatal(err)
	}
	u.Spec.Role = appv1.RoleMember
	if err := s.cp.Client.Update(ctx, u); err != nil {
		t.Fatal(err)
	}
	took = daveShop.endsWith(t, time.Now(), "is no longer an admin, and not a member of shop: this session ends")
	t.Logf("demoting dave ended his logs -f shop in %v", took.Round(time.Millisecond))
	// The controls: the rechecks that ended dave's session looked at these too.
	carolShop.stillOpen(t, "carol's logs -f shop (still a member)")
	bobCart.stillOpen(t, "bob's logs -f cart (still a member of cart)")

	// A removed user's sessions end with them: users:remove takes them off the
	// apps' members first, so the recheck may see either change first.
	admin.ok("", "users:remove", carol.name)
	took = carolShop.endsWith(t, time.Now(), "no longer belongs to "+carol.name, "bex: your access to shop was removed: this session ends")
	t.Logf("users:remove ended carol's logs -f shop in %v", took.Round(time.Millisecond))
	bobCart.stillOpen(t, "bob's logs -f cart")
}

// TestRemovingOwnKeyEndsItsOtherSessions: keys:remove of the key a session
// signed in with answers that session (exit 0, the line that says it), which
// the rechecks used to cut off now and then between the removal and that
// line; the user's other session with the same key, a `logs -f`, ends within
// 2 s, and the key is refused after.
func TestRemovingOwnKeyEndsItsOtherSessions(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	bob := s.addUser("bob", appv1.RoleMember, false)
	if err := s.cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "cart", Namespace: s.ns}, Spec: appv1.AppSpec{Members: []string{bob.name}}}); err != nil {
		t.Fatal(err)
	}
	s.eventually(func() error { _, err := s.dir.App(ctx, "cart"); return err })
	tail := bob.start("logs", "cart", "-f")
	tail.streaming(t, "cart")
	removed := time.Now()
	if out := bob.ok("", "keys:remove", "laptop"); !strings.Contains(out, "laptop") {
		t.Fatalf("keys:remove laptop: %q", out)
	}
	took := tail.endsWith(t, removed, "no longer belongs to "+bob.name)
	t.Logf("keys:remove ended bob's logs -f cart in %v", took.Round(time.Millisecond))
	s.eventually(func() error {
		if _, errOut, code := bob.ssh("", "apps:list"); code != 255 || !strings.Contains(errOut, "Permission denied") {
			return errors.New("bob's removed key still connects: " + errOut)
		}
		return nil
	})
}

// openShell is a database's client (psql, redis-cli) that prints one line and
// then waits, as one on a terminal waits for what is typed, until the
// session's context ends.
type openShell struct{}

func (openShell) Run(ctx context.Context, s backend.RunSpec) (int, error) {
	fmt.Fprintf(s.Stdout, "hello from %s\n", s.App.Labels[appv1.LabelDatabase])
	<-ctx.Done()
	return 0, ctx.Err()
}

func (openShell) Start(context.Context, backend.RunSpec, func(int)) error {
	return errors.New("a database's client is never detached")
}

// TestWithdrawnDatabaseAccessEndsOpenSessions: postgres:access:remove and
// redis:access:remove each end the removed member's open psql or redis-cli
// within 2 s, with one line saying why, while another member's session on the
// database, and the same user's on another database, go on. The user is a
// member of an app of the database's name all along: a database's access is
// checked as a database's, not an app's.
func TestWithdrawnDatabaseAccessEndsOpenSessions(t *testing.T) {
	s := newServer(t, func(c *backend.Config) { c.Runner = openShell{} })
	ctx := context.Background()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, false)
	carol := s.addUser("carol", appv1.RoleMember, false)
	if err := s.cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "ledger", Namespace: s.ns}, Spec: appv1.AppSpec{Members: []string{bob.name}}}); err != nil {
		t.Fatal(err)
	}
	for _, db := range []struct {
		name    string
		engine  appv1.DatabaseEngine
		members []string
	}{{"ledger", appv1.EnginePostgres, []string{bob.name, carol.name}}, {"cache", appv1.EngineRedis, []string{bob.name}}} {
		if err := s.cp.Client.Create(ctx, &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: db.name, Namespace: s.ns},
			Spec: appv1.DatabaseSpec{Engine: db.engine, Size: resource.MustParse("64Mi"), Members: db.members}}); err != nil {
			t.Fatal(err)
		}
		s.runDatabase(ctx, db.name)
		s.eventually(func() error {
			out, errOut, _ := bob.ssh("", string(db.engine)+":info", db.name)
			if !strings.Contains(out, "Running") {
				return fmt.Errorf("%s:info %s: %q %q", db.engine, db.name, out, errOut)
			}
			return nil
		})
	}

	bobLedger, bobCache := bob.start("postgres:psql", "ledger"), bob.start("redis:cli", "cache")
	carolLedger := carol.start("postgres:psql", "ledger")
	bobLedger.streaming(t, "ledger")
	bobCache.streaming(t, "cache")
	carolLedger.streaming(t, "ledger")

	admin.ok("", "postgres:access:remove", "ledger", bob.name)
	took := bobLedger.endsWith(t, time.Now(), "bex: your access to the database ledger was removed: this session ends")
	t.Logf("postgres:access:remove ended bob's psql in %v", took.Round(time.Millisecond))
	bob.refused(`no postgres database "ledger"`, "postgres:psql", "ledger")
	// The controls: the recheck that ended bob's psql looked at these too.
	carolLedger.stillOpen(t, "carol's psql on ledger (still a member)")
	bobCache.stillOpen(t, "bob's redis-cli on cache (still a member of cache)")

	admin.ok("", "redis:access:remove", "cache", bob.name)
	took = bobCache.endsWith(t, time.Now(), "bex: your access to the database cache was removed: this session ends")
	t.Logf("redis:access:remove ended bob's redis-cli in %v", took.Round(time.Millisecond))
	carolLedger.stillOpen(t, "carol's psql on ledger")

	// users:remove takes carol off the databases' members, then removes her.
	admin.ok("", "users:remove", carol.name)
	took = carolLedger.endsWith(t, time.Now(), "no longer belongs to "+carol.name, "bex: your access to the database ledger was removed: this session ends")
	t.Logf("users:remove ended carol's psql in %v", took.Round(time.Millisecond))
}
