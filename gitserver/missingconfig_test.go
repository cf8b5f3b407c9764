package gitserver_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/pipeline"
)

// TestMissingConfigVarRefusesThePush: a build refused for a config var app.json
// requires (the Builder's MissingConfigError) rejects the push with one line
// that names the var and config:set, the ref status (missing config var), and
// neither the ref nor the releases move.
func TestMissingConfigVarRefusesThePush(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "push", "bex", "main")

	e.builder.setHook(func(_ context.Context, req pipeline.BuildRequest, _ io.Writer) error {
		return fmt.Errorf("building: %w", &pipeline.MissingConfigError{App: req.App, Names: []string{"DATABASE_URL"}})
	})
	admin.commit(dir, "app.txt", "needs a database\n")
	out, err := admin.git(dir, "push", "bex", "main")
	if err == nil {
		t.Fatalf("push succeeded:\n%s", out)
	}
	for _, want := range []string{
		"remote:  !     app.json requires config var DATABASE_URL, which hello does not set: set it with config:set hello DATABASE_URL=..., then push again",
		"! [remote rejected] main -> main (missing config var)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Build failed") {
		t.Errorf("a refusal is no failed build:\n%s", out)
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main moved to %s after a refused push; want %s", got, first)
	}
	if n := len(e.releaser.all()); n != 1 {
		t.Fatalf("%d releases; a refused push must not release", n)
	}
	two := (&pipeline.MissingConfigError{App: "hello", Names: []string{"A", "B"}}).Error()
	if two != "app.json requires config vars A, B, which hello does not set: set them with config:set hello A=... B=..., then push again" {
		t.Errorf("two vars: %q", two)
	}
}
