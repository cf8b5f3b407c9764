package local

import (
	"context"
	"testing"
	"time"
)

// TestOneOffExecFailureExitsAsAShell: a command that is not there exits 127,
// one that cannot be executed 126, each with the shell's line on stderr, as
// through sh; a detached one's done gets the same status.
func TestOneOffExecFailureExitsAsAShell(t *testing.T) {
	f := newFixture(t, "oneoff-exec")
	o := f.newOneOffs()
	ctx := context.Background()
	for _, c := range []struct {
		cmd    []string
		status int
		line   string
	}{
		{[]string{"nosuchcmd", "arg"}, 127, "bex: nosuchcmd: command not found\n"},
		{[]string{"/nope/x"}, 127, "bex: /nope/x: No such file or directory\n"},
		{[]string{"/etc/passwd"}, 126, "bex: /etc/passwd: Permission denied\n"},
	} {
		var out, errb syncBuffer
		oo := f.oneOff(c.cmd...)
		oo.Stdout, oo.Stderr = &out, &errb
		exit, err := o.Run(ctx, oo)
		if err != nil || exit != c.status || errb.String() != c.line || out.String() != "" {
			t.Errorf("%v: exit %d, %v, stderr %q, stdout %q; want %d %q", c.cmd, exit, err, errb.String(), out.String(), c.status, c.line)
		}
	}
	done := make(chan int, 1)
	if err := o.Start(ctx, f.oneOff("nosuchcmd"), func(exit int) { done <- exit }); err != nil {
		t.Fatalf("start: %v", err)
	}
	select {
	case exit := <-done:
		if exit != 127 {
			t.Errorf("detached: exit %d, want 127", exit)
		}
	case <-time.After(time.Minute):
		t.Fatal("detached: done was not called")
	}
	f.noOneOffLeft()
}
