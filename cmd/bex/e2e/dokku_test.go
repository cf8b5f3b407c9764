package e2e

import (
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// dokkuDockerfile is a busybox web app whose working directory /app the
// process may write (the fixture does not rely on the plans' own writable
// /app): the deployment tasks write their markers there.
const dokkuDockerfile = `FROM busybox
RUN mkdir -p /www /app && chmod 777 /app
COPY index.html /www/index.html
WORKDIR /app
CMD ["sh", "-c", "exec httpd -f -p \"$PORT\" -h /www"]
`

// dokkuTasks is app.json with Dokku's deployment tasks, as Dokku's own test
// apps write them (JSONC, as Dokku reads it).
func dokkuTasks(predeploy, postdeploy string) string {
	return `{
  // Dokku's deployment tasks
  "scripts": {"dokku": {"predeploy": "` + predeploy + `", "postdeploy": "` + postdeploy + `"}},
}
`
}

// TestDokkuDeploymentTasks: a Dokku-style app pushed as it is, with the real git
// and ssh: predeploy and release both run and write into /app, and only what
// predeploy wrote is in the release (release: and postdeploy write into
// instances of their own); a failing predeploy, release command or postdeploy
// each rejects the push naming its phase, the ref where it was and the release
// that served before answering on the edge.
func TestDokkuDeploymentTasks(t *testing.T) {
	p := sharedPlatform(t)
	const app = "dokku-tasks"
	r := p.newRepo(t, "hello-shell", app)
	const procfile = "web: httpd -f -p $PORT -h /www\nrelease: touch /app/released\n"
	r.commit(t, "dokku", map[string]string{
		"Dockerfile": dokkuDockerfile,
		"index.html": "hello from bex\n",
		"Procfile":   procfile,
		"app.json":   dokkuTasks("touch /app/predeployed", "touch /app/postdeployed"),
	})
	out, err := r.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	for _, want := range []string{"predeploy (app.json scripts.dokku.predeploy): touch /app/predeployed", "Running the release command of v1",
		"Running the postdeploy script of v1 (app.json scripts.dokku.postdeploy)", "Application deployed: release v1"} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q:\n%s", want, out)
		}
	}
	testenv.Eventually(t, time.Minute, app+" answers", p.answers(app, "/", "hello from bex"))
	ls, e, err := p.ssh(t, quoteWords([]string{"run", app, "ls", "/app"})...)
	if err != nil || strings.Fields(ls) == nil || strings.Join(strings.Fields(ls), " ") != "predeployed" {
		t.Fatalf("run ls /app: %v %s\n%q (want predeployed alone: release's and postdeploy's changes are not kept)", err, e, ls)
	}
	served := r.remoteHead(t)
	spec := func(path string) string { return p.kubectl(t, "get", "app", app, "-o", "jsonpath={"+path+"}") }

	rejected := func(t *testing.T, status string, wants ...string) {
		t.Helper()
		out, err := r.push()
		if err == nil {
			t.Fatalf("push succeeded:\n%s", out)
		}
		for _, want := range append(wants, "! [remote rejected] main -> main ("+status+")") {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in:\n%s", want, out)
			}
		}
		if h := r.remoteHead(t); h != served {
			t.Errorf("the ref moved: %s, was %s", h, served)
		}
		testenv.Eventually(t, time.Minute, "v1 answers on the edge", p.answers(app, "/", "hello from bex"))
		if got := spec(".spec.release"); got != "1" {
			t.Errorf("the App asks for release %s, not v1", got)
		}
	}
	t.Run("a failing predeploy", func(t *testing.T) {
		r.commit(t, "predeploy fails", map[string]string{
			"index.html": "never served\n",
			"app.json":   dokkuTasks("echo predeploy-broke; exit 3", "true"),
		})
		rejected(t, "predeploy failed", "remote:        predeploy-broke", "predeploy (app.json scripts.dokku.predeploy) exited with status 3",
			"Nothing changed on "+app+": release v1 keeps serving.")
	})
	t.Run("a failing release command", func(t *testing.T) {
		r.commit(t, "release fails", map[string]string{
			"app.json": dokkuTasks("touch /app/predeployed", "true"),
			"Procfile": "web: httpd -f -p $PORT -h /www\nrelease: sh -c 'echo release-broke; exit 4'\n",
		})
		rejected(t, "release command failed", "remote: release-broke", "release command exited with status 4",
			"Nothing changed on "+app+": release v1 keeps serving.")
	})
	t.Run("a failing postdeploy", func(t *testing.T) {
		r.commit(t, "postdeploy fails", map[string]string{
			"app.json": dokkuTasks("touch /app/predeployed", "echo postdeploy-broke; exit 5"),
			"Procfile": procfile,
		})
		rejected(t, "postdeploy failed", "postdeploy-broke", "postdeploy (app.json scripts.dokku.postdeploy) exited with status 5",
			"Going back to v1, which served before v", "v1 serves again", "Release v1 keeps serving.")
	})
}
