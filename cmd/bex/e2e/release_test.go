package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestReleasePhaseAndAppJSON: the Procfile's release command and app.json end to
// end, with bex up as its own process and real git pushes over ssh: a failing
// release command rejects the push with its output and moves nothing; a
// succeeding one runs exactly once with the new config; config:set is refused
// when it fails; app.json's formation, health check and cron land in the App, a
// malformed app.json is rejected with its line, and ps:scale survives a push.
func TestReleasePhaseAndAppJSON(t *testing.T) {
	p := sharedPlatform(t)
	const app = "migrates"
	r := p.newRepo(t, "hello-shell", app)
	if out, err := r.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	ssh := func(args ...string) (string, string, error) { return p.ssh(t, quoteWords(args)...) }
	if _, e, err := ssh("config:set", app, "GREETING=hola"); err != nil {
		t.Fatalf("config:set: %v %s", err, e)
	}
	served := r.remoteHead(t)
	spec := func(path string) string {
		return p.kubectl(t, "get", "app", app, "-o", "jsonpath={"+path+"}")
	}
	before := spec(".spec.release")
	web := "web: httpd -f -p $PORT -h /www\nworker: sleep 100000\n"

	t.Run("a failing release command rejects the push", func(t *testing.T) {
		r.commit(t, "fails", map[string]string{"Procfile": web + "release: sh -c 'echo migrating $GREETING; exit 3'\n"})
		out, err := r.push()
		if err == nil {
			t.Fatalf("push succeeded:\n%s", out)
		}
		for _, want := range []string{"remote: migrating hola", "release command exited with status 3", "! [remote rejected] main -> main (release command failed)"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in:\n%s", want, out)
			}
		}
		if h := r.remoteHead(t); h != served {
			t.Errorf("the ref moved: %s, was %s", h, served)
		}
		if got := spec(".spec.release"); got != before {
			t.Errorf("the App moved to release %s from %s", got, before)
		}
		if err := p.answers(app, "/", "hello from bex")(); err != nil {
			t.Errorf("the previous release stopped serving: %v", err)
		}
	})

	markers := func(marker string) int {
		out, _, _ := ssh("logs", app, "--process", "release", "-n", "1000")
		return strings.Count(out, marker)
	}
	t.Run("a succeeding release command runs once with the new config", func(t *testing.T) {
		r.commit(t, "works", map[string]string{"Procfile": web + "release: sh -c 'test \"$GREETING\" != fail || exit 4; echo release-marker $GREETING'\n"})
		if out, err := r.push(); err != nil || !strings.Contains(out, "remote: release-marker hola") {
			t.Fatalf("push: %v\n%s", err, out)
		}
		testenv.Eventually(t, 30*time.Second, "one release-marker in the logs", func() error {
			if n := markers("release-marker hola"); n != 1 {
				return fmt.Errorf("%d markers", n)
			}
			return nil
		})
		if _, e, err := ssh("config:set", app, "GREETING=bonjour"); err != nil || !strings.Contains(e, "release-marker bonjour") {
			t.Fatalf("config:set: %v %s", err, e)
		}
		if n := markers("release-marker bonjour"); n != 1 {
			t.Errorf("%d runs for config:set", n)
		}
		_, e, err := ssh("config:set", app, "GREETING=fail")
		if err == nil || !strings.Contains(e, "release command exited with status 4") {
			t.Fatalf("config:set with a failing release command: %v %s", err, e)
		}
		if out, _, _ := ssh("config:get", app, "GREETING"); strings.TrimSpace(out) != "bonjour" {
			t.Errorf("GREETING is %q after the refused config:set", out)
		}
	})

	t.Run("app.json", func(t *testing.T) {
		r.commit(t, "bad app.json", map[string]string{"app.json": "{\n  \"cron\": [\n    {\"command\": \"echo hi\",\n     \"schedule\": \"every day\"}\n  ]\n}\n"})
		out, err := r.push()
		if err == nil || !strings.Contains(out, `app.json line 4: cron[0].schedule: "every day" is not a cron schedule`) {
			t.Fatalf("malformed app.json: %v\n%s", err, out)
		}
		r.commit(t, "app.json", map[string]string{"app.json": `{"addons": [], "formation": {"worker": {"quantity": 2}},
 "healthchecks": {"web": [{"type": "startup", "path": "/index.html", "attempts": 5}]},
 "cron": [{"command": "echo tick", "schedule": "@daily"}]}`})
		out, err = r.push()
		if err != nil || !strings.Contains(out, `remote: app.json: "addons" is ignored: bex does not read it`) {
			t.Fatalf("push: %v\n%s", err, out)
		}
		if got := spec(".spec.processes.worker.replicas"); got != "2" {
			t.Errorf("worker replicas %q", got)
		}
		if got := spec(".spec.healthCheck.path"); got != "/index.html" {
			t.Errorf("health check %q", got)
		}
		if got := spec(".spec.cron[0].schedule"); got != "@daily" {
			t.Errorf("cron %q", got)
		}
		if out, _, err := ssh("ps", app); err != nil || !psReplicas(out, "worker", "2") {
			t.Errorf("ps: %v\n%s", err, out)
		}
		if _, e, err := ssh("ps:scale", app, "worker=1"); err != nil {
			t.Fatalf("ps:scale: %v %s", err, e)
		}
		r.commit(t, "again", map[string]string{"README": "again\n"})
		if out, err := r.push(); err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		if got := spec(".spec.processes.worker.replicas"); got != "1" {
			t.Errorf("ps:scale did not survive the push: worker replicas %q", got)
		}
		// A health check that fails rejects the push (last: the App keeps it).
		served := r.remoteHead(t)
		r.commit(t, "bad check", map[string]string{"app.json": `{"healthchecks": {"web": [{"path": "/nope", "attempts": 1, "timeout": 1, "wait": 1}]}}`})
		if out, err := r.push(); err == nil {
			t.Fatalf("a failing health check was pushed:\n%s", out)
		}
		if h := r.remoteHead(t); h != served {
			t.Errorf("the ref moved after a failing health check")
		}
	})
}

// psReplicas says whether ps's table shows process type typ with n replicas.
func psReplicas(out, typ, n string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == typ && f[1] == n {
			return true
		}
	}
	return false
}

// TestAppJSONEnv: app.json's env on a new app, pushed with the real git over
// ssh: a required var the app lacks refuses the first push with a line naming
// it and config:set, and the ref does not move; once set, the push deploys with
// app.json's value and a generated 64-hex secret, and a later push changes
// neither.
func TestAppJSONEnv(t *testing.T) {
	p := sharedPlatform(t)
	const app = "withenv"
	r := p.newRepo(t, "hello-shell", app)
	r.commit(t, "app.json", map[string]string{"app.json": `{
  // Heroku's schema, as Dokku reads it
  "env": {
    "GREETING": {"description": "what the app says", "value": "from-app-json"},
    "SECRET_KEY": {"generator": "secret"},
    "DATABASE_URL": {"description": "the database", "required": true},
    "OPTIONAL": {"required": false},
  },
}`})
	ssh := func(args ...string) (string, string, error) { return p.ssh(t, quoteWords(args)...) }
	out, err := r.push()
	if err == nil {
		t.Fatalf("a push without DATABASE_URL was accepted:\n%s", out)
	}
	for _, want := range []string{
		"remote:  !     app.json requires config var DATABASE_URL, which withenv does not set: set it with config:set withenv DATABASE_URL=..., then push again",
		"! [remote rejected] main -> main (missing config var)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "app.json requires config var"); n != 1 || strings.Contains(out, "Building withenv") && strings.Contains(out, "Built ") {
		t.Errorf("the refusal is said %d times, or something was built:\n%s", n, out)
	}
	if h := r.remoteHead(t); h != "" {
		t.Errorf("the ref moved to %s on a refused push", h)
	}
	if _, e, err := ssh("config:set", app, "DATABASE_URL=postgres://db/app"); err != nil {
		t.Fatalf("config:set: %v %s", err, e)
	}
	if out, err := r.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	env := func() map[string]string {
		out, e, err := ssh("run", app, "env")
		if err != nil {
			t.Fatalf("run env: %v %s", err, e)
		}
		m := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				m[k] = v
			}
		}
		return m
	}
	got := env()
	secret := got["SECRET_KEY"]
	if got["GREETING"] != "from-app-json" || got["DATABASE_URL"] != "postgres://db/app" || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(secret) {
		t.Fatalf("env after the first deploy: GREETING=%q DATABASE_URL=%q SECRET_KEY=%q", got["GREETING"], got["DATABASE_URL"], secret)
	}
	if _, ok := got["OPTIONAL"]; ok {
		t.Errorf("OPTIONAL, with no value, was set")
	}
	if _, e, err := ssh("config:set", app, "GREETING=mine"); err != nil {
		t.Fatalf("config:set: %v %s", err, e)
	}
	r.commit(t, "again", map[string]string{"README": "again\n"})
	if out, err := r.push(); err != nil {
		t.Fatalf("second push: %v\n%s", err, out)
	}
	got = env()
	if got["SECRET_KEY"] != secret || got["GREETING"] != "mine" {
		t.Errorf("a second push changed app.json's vars: GREETING=%q, SECRET_KEY %q was %q", got["GREETING"], got["SECRET_KEY"], secret)
	}
}
