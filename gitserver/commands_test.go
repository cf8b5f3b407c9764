package gitserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/internal/testenv"
)

// echoCommands prints the session it got as JSON, reads stdin for "cat", blocks
// until ctx ends for "wait", and exits with status 3 for "fail".
type echoCommands struct {
	mu      sync.Mutex
	waiting int // sessions in "wait"
	ended   []string
}

func (c *echoCommands) Run(ctx context.Context, s gitserver.CommandSession) int {
	defer func() {
		c.mu.Lock()
		c.ended = append(c.ended, strings.Join(s.Args, " "))
		c.mu.Unlock()
	}()
	if len(s.Args) > 0 {
		switch s.Args[0] {
		case "cat":
			_, _ = io.Copy(s.Stdout, s.Stdin)
			return 0
		case "wait":
			fmt.Fprintln(s.Stdout, "waiting")
			c.mu.Lock()
			c.waiting++
			c.mu.Unlock()
			<-ctx.Done()
			return 0
		case "fail":
			fmt.Fprintln(s.Stderr, "bex: failed on purpose")
			return 3
		}
	}
	_ = json.NewEncoder(s.Stdout).Encode(map[string]any{"user": s.User.Name, "fp": s.KeyFingerprint, "args": s.Args})
	return 0
}

// ssh runs the real ssh client as u with the remote command args (joined by
// spaces by ssh itself, as typed).
func (u *user) ssh(stdin string, args ...string) (stdout, stderr string, code int) {
	cmd := testenv.SSHCommand(u.key, "bex", u.env.addr, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		code = 255
	}
	return o.String(), e.String(), code
}

func TestCommandsGetNonGitSessions(t *testing.T) {
	cmds := &echoCommands{}
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(cmds)})
	admin := e.addUser("admin", appv1.RoleAdmin, false)

	out, errOut, code := admin.ssh("", "apps:info", "'my app'", `"x;\$(y)"`)
	var got struct {
		User string
		FP   string
		Args []string
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got.User != admin.name || !strings.HasPrefix(got.FP, "SHA256:") || !slices.Equal(got.Args, []string{"apps:info", "my app", "x;$(y)"}) {
		t.Fatalf("session %+v", got)
	}
	// No command: the Commands get an empty one (they print help).
	if out, _, code := admin.ssh(""); code != 0 || !strings.Contains(out, `"args":null`) {
		t.Fatalf("no command: exit %d, %q", code, out)
	}
	if out, _, code := admin.ssh("from stdin\n", "cat"); code != 0 || out != "from stdin\n" {
		t.Fatalf("stdin: exit %d, %q", code, out)
	}
	if _, errOut, code := admin.ssh("", "fail"); code != 3 || errOut != "bex: failed on purpose\n" {
		t.Fatalf("exit status: %d, %q", code, errOut)
	}
	if _, errOut, code := admin.ssh("", "config:set", `"a`); code != 2 || !strings.Contains(errOut, "not closed") {
		t.Fatalf("unclosed quote: %d, %q", code, errOut)
	}
	// git still goes to git.
	e.createApp("app", admin)
	if out, err := admin.git(t.TempDir(), "ls-remote", e.url("app")); err == nil || !strings.Contains(out, "no code yet") {
		t.Fatalf("git ls-remote: %v\n%s", err, out)
	}
}

func TestRemovingAKeyClosesItsSessions(t *testing.T) {
	cmds := &echoCommands{}
	e := newEnvWith(t, []gitserver.Option{gitserver.WithCommands(cmds)}, func(c *config) { c.SessionRecheck = 200 * time.Millisecond })
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	other := e.addUser("other", appv1.RoleMember, false)

	type result struct {
		out, errOut string
		code        int
	}
	start := func(u *user) chan result {
		done := make(chan result, 1)
		go func() {
			o, eo, c := u.ssh("", "wait")
			done <- result{o, eo, c}
		}()
		return done
	}
	adminDone, otherDone := start(admin), start(other)
	// Both sessions are open (their command runs) before the key goes.
	e.eventually(func() error {
		cmds.mu.Lock()
		defer cmds.mu.Unlock()
		if len(cmds.ended) > 0 {
			t.Fatalf("a session ended early: %v", cmds.ended)
		}
		if cmds.waiting != 2 {
			return fmt.Errorf("%d sessions waiting", cmds.waiting)
		}
		return nil
	})
	var u appv1.User
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Name: admin.name}, &u); err != nil {
		t.Fatal(err)
	}
	u.Spec.Keys = nil
	if err := e.cp.Client.Update(context.Background(), &u); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	select {
	case r := <-adminDone:
		if !strings.Contains(r.errOut, "no longer belongs to "+admin.name) {
			t.Fatalf("the removed key's session ended with %d, %q, %q", r.code, r.out, r.errOut)
		}
		t.Logf("closed %v after the key was removed", time.Since(removed).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the removed key's session is still open after 5s")
	}
	select {
	case r := <-otherDone:
		t.Fatalf("another user's session ended too: %+v", r)
	case <-time.After(time.Second): // no wait: a bound on a negative (five rechecks leave the other key's session open), which a correct server always passes
	}
	// And the key is refused on its next connection.
	if _, errOut, code := admin.ssh("", "apps:list"); code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("the removed key connected again: %d %q", code, errOut)
	}
}
