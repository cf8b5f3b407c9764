package sshcmd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/backend"
)

// fakeRunner records the specs it gets; a run echoes its stdin and exits with
// the number its command's last word is, or 0.
type fakeRunner struct {
	mu      sync.Mutex
	runs    []backend.RunSpec
	started []backend.RunSpec
}

func (r *fakeRunner) Run(_ context.Context, s backend.RunSpec) (int, error) {
	r.mu.Lock()
	r.runs = append(r.runs, s)
	r.mu.Unlock()
	if s.Stdin != nil {
		_, _ = io.Copy(s.Stdout, s.Stdin)
	}
	if s.TTY != nil {
		fmt.Fprintf(s.Stdout, "%d %d %s\n", s.TTY.Height, s.TTY.Width, s.TTY.Term)
	}
	var n int
	_, _ = fmt.Sscan(s.Command[len(s.Command)-1], &n)
	return n, nil
}

func (r *fakeRunner) Start(_ context.Context, s backend.RunSpec, done func(int)) error {
	r.mu.Lock()
	r.started = append(r.started, s)
	r.mu.Unlock()
	done(0)
	return nil
}

func TestRun(t *testing.T) {
	r := &fakeRunner{}
	a := deployed(app("shop", "bob"))
	a.Spec.Release = 4
	a.Spec.Env = []appv1.EnvVar{{Name: "A", Value: "1"}}
	f := newFixtureWith(t, func(c *backend.Config) { c.Runner = r }, a, app("bare", "bob"))

	// The words after APP (and after --) are the command verbatim, flags too.
	out, errOut, code := f.run(bob, "hi\n", "run", "shop", "--", "sh", "-c", "exit 3", "--detach", "3")
	if code != 3 || out != "hi\n" || errOut != "" {
		t.Fatalf("run: %d %q %q", code, out, errOut)
	}
	s := r.runs[0]
	if strings.Join(s.Command, " ") != "sh -c exit 3 --detach 3" || s.Image != a.Spec.Image || s.Release != 4 ||
		s.Process != "run."+s.ID || len(s.ID) != 12 || len(s.Env) != 1 || s.TTY != nil || s.Timeout != 0 {
		t.Fatalf("spec: %+v", s)
	}
	if _, _, code := f.run(bob, "", "run", "shop", "ls", "-l", "0"); code != 0 || strings.Join(r.runs[1].Command, " ") != "ls -l 0" {
		t.Fatalf("run without --: %d %v", code, r.runs[1].Command)
	}
	if !strings.Contains(f.log.String(), "command=run") {
		t.Errorf("no audit line: %s", f.log.String())
	}

	// A terminal passes through, with one output stream.
	var o bytes.Buffer
	code = f.cmds.Run(context.Background(), gitserver.CommandSession{User: bob, KeyFingerprint: "SHA256:test",
		Args: []string{"run", "shop", "sh"}, Stdin: strings.NewReader(""), Stdout: &o, Stderr: io.Discard,
		TTY: &backend.TTY{Term: "xterm-256color", Width: 80, Height: 24}})
	if code != 0 || o.String() != "24 80 xterm-256color\n" {
		t.Fatalf("tty: %d %q", code, o.String())
	}

	// --detach prints the id and returns.
	out, errOut, code = f.run(bob, "", "run", "--detach", "shop", "sleep", "10")
	if code != 0 || len(r.started) != 1 || out != r.started[0].ID+"\n" || !strings.Contains(errOut, "logs shop --process run."+r.started[0].ID) ||
		r.started[0].Timeout != backend.DefaultDetachedTimeout {
		t.Fatalf("detach: %d %q %q %+v", code, out, errOut, r.started)
	}

	// Refusals: one line each.
	for _, c := range []struct {
		args []string
		u    *backend.User
		want string
	}{
		{[]string{"run", "shop"}, bob, "usage: run"},
		{[]string{"run", "shop", "--"}, bob, "usage: run"},
		{[]string{"run", "bare", "sh"}, bob, "bare has no release serving yet"},
		{[]string{"run", "shop", "sh"}, carol, "no access to app shop"},
		{[]string{"run", "nope", "sh"}, bob, "nope"},
	} {
		_, errOut, code := f.run(c.u, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: %d %q, want %q", c.args, code, errOut, c.want)
		}
	}
	if len(r.runs) != 3 {
		t.Errorf("runs: %d, want 3", len(r.runs))
	}

	// logs --process takes a run's name, and nothing with path characters.
	if _, errOut, code := f.run(bob, "", "logs", "shop", "--process", "run."+r.started[0].ID); code != 0 || f.logs.got.Process != "run."+r.started[0].ID {
		t.Fatalf("logs --process run.<id>: %d %q %+v", code, errOut, f.logs.got)
	}
	for _, p := range []string{"release", "postdeploy", "cron.nightly"} {
		if _, errOut, code := f.run(bob, "", "logs", "shop", "--process", p); code != 0 {
			t.Errorf("logs --process %s: %d %q", p, code, errOut)
		}
	}
	for _, p := range []string{"run.../x", "run./etc", "run.", "cron.a/b", "../web"} {
		if _, _, code := f.run(bob, "", "logs", "shop", "--process", p); code == 0 {
			t.Errorf("logs --process %q accepted", p)
		}
	}
}
