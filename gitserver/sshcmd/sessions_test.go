package sshcmd_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
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

// streaming waits until the session printed its first log line: the command
// runs, past its access check.
func (r *running) streaming(t *testing.T, app string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the logs session to stream", func() error {
		select {
		case <-r.done:
			t.Fatalf("logs -f %s ended early: exit %d, %q", app, r.code, r.errOut.String())
		default:
		}
		if !strings.Contains(r.out.String(), "hello from "+app) {
			return fmt.Errorf("stdout so far %q", r.out.String())
		}
		return nil
	})
}

// endsWith waits up to 2 s (the promise) for the session to end with exactly
// one line on stderr containing want and a failing status; it returns how long
// it took from since.
func (r *running) endsWith(t *testing.T, since time.Time, want string) time.Duration {
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
	if r.code == 0 || !strings.Contains(errOut, want) || strings.Count(strings.TrimLeft(errOut, "\n"), "\n") != 1 {
		t.Fatalf("the session ended with exit %d, stderr %q; want one line with %q", r.code, r.errOut.String(), want)
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

	// A removed user's sessions end with them.
	admin.ok("", "users:remove", carol.name)
	took = carolShop.endsWith(t, time.Now(), "no longer belongs to "+carol.name)
	t.Logf("users:remove ended carol's logs -f shop in %v", took.Round(time.Millisecond))
	bobCart.stillOpen(t, "bob's logs -f cart")
}
