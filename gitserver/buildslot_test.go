package gitserver_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

// With one build slot, a second app's push waits for it, saying so; a build
// that gives its slot back while it waits for something else (the base images)
// lets that push build at once, and takes the slot again before it goes on.
func TestABuildThatGivesItsSlotBackLetsTheOthersBuild(t *testing.T) {
	e := newEnv(t, func(c *config) { c.MaxConcurrentBuilds = 1 })
	admin := e.addUser("admin", appv1.RoleAdmin, false)

	reacquired := make(chan error, 1)
	first, second := admin.workdir("first"), admin.workdir("second")
	// push commits a change in dir and starts pushing it: what git says, and
	// its end.
	push := func(dir, round string) (*testenv.SyncBuffer, chan error) {
		admin.commit(dir, "app.txt", round+"\n")
		cmd := admin.gitCmd(dir, "push", "bex", "main")
		out := &testenv.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return out, done
	}
	// pushWhileFirstWaits pushes the app "first", whose build waits (its slot
	// given back or not), then "second", and returns what the second push said.
	pushWhileFirstWaits := func(round string, giveBack bool) string {
		started := make(chan struct{}, 1)
		proceed := make(chan struct{})
		e.builder.setHook(func(ctx context.Context, req pipeline.BuildRequest, _ io.Writer) error {
			if req.App != "first" {
				return nil
			}
			if giveBack {
				req.Slot.Release()
			}
			started <- struct{}{}
			<-proceed
			if giveBack {
				err := req.Slot.Acquire(ctx)
				reacquired <- err
				return err
			}
			return nil
		})
		firstOut, firstDone := push(first, round)
		select {
		case <-started:
		case err := <-firstDone:
			t.Fatalf("the first push ended before its build began (%v):\n%s", err, firstOut)
		}
		secondOut, secondDone := push(second, round)
		if giveBack {
			// The second push needs no slot the first one holds.
			if err := <-secondDone; err != nil {
				t.Fatalf("the second push: %v\n%s", err, secondOut)
			}
			close(proceed)
		} else {
			e.eventually(func() error {
				if !strings.Contains(secondOut.String(), "Waiting for a build slot (1 builds are running)") {
					return fmt.Errorf("the second push so far: %q", secondOut.String())
				}
				return nil
			})
			close(proceed)
			if err := <-secondDone; err != nil {
				t.Fatalf("the second push: %v\n%s", err, secondOut)
			}
		}
		if err := <-firstDone; err != nil {
			t.Fatalf("the first push: %v\n%s", err, firstOut)
		}
		return secondOut.String()
	}

	// The control: a build that keeps its slot makes the other push wait.
	pushWhileFirstWaits("kept", false)
	if out := pushWhileFirstWaits("given back", true); strings.Contains(out, "Waiting for a build slot") {
		t.Fatalf("the second push waited for the slot the first build gave back:\n%s", out)
	}
	if err := <-reacquired; err != nil {
		t.Fatalf("the first build could not take its slot again: %v", err)
	}
}
