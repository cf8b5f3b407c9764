package builder

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"bex.co/bex/builder/plan"
)

func scriptsOf(t *testing.T, files map[string]string, shell bool) (*Result, string, error) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	p := &plan.Plan{Shell: shell}
	if p.Processes, err = plan.ReadProcfile(root.FS()); err != nil {
		t.Fatal(err)
	}
	res := &Result{}
	var out bytes.Buffer
	err = scripts(root, p, &out, res)
	return res, out.String(), err
}

// Dokku's phases are all kept: the Procfile's release command, predeploy as a
// build step (literal: the build step runs it as it is), dokku.postdeploy and
// Heroku's postdeploy.
func TestProcfileReleaseAndPredeploy(t *testing.T) {
	res, out, err := scriptsOf(t, map[string]string{
		"Procfile": "web: ./server\nrelease: ./migrate --all\n",
		"app.json": `{"name": "x", "scripts": {"dokku": {"predeploy": "echo $$ $(date) $HOME", "postdeploy": "./warm"}, "postdeploy": "./seed"}, "cron": [{"command": "./r", "schedule": "@daily"}]}`,
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Processes["release"]; ok || len(res.Processes) != 1 {
		t.Errorf("processes %v", res.Processes)
	}
	if strings.Join(res.Release, " ") != "sh -c exec ./migrate --all" || strings.Join(res.Postdeploy, " ") != "sh -c exec ./warm" ||
		strings.Join(res.FirstPostdeploy, " ") != "sh -c exec ./seed" {
		t.Errorf("release %q postdeploy %q first postdeploy %q", res.Release, res.Postdeploy, res.FirstPostdeploy)
	}
	if !slices.Equal(res.Predeploy, []string{"sh", "-c", "echo $$ $(date) $HOME"}) {
		t.Errorf("predeploy %q", res.Predeploy)
	}
	if res.AppJSON == nil || len(res.AppJSON.Cron) != 1 {
		t.Errorf("app.json %+v", res.AppJSON)
	}
	if !strings.Contains(out, `app.json: "name" is ignored: bex does not read it`) || strings.Contains(out, "predeploy") {
		t.Errorf("output %q", out)
	}
}

func TestPredeployWithoutShell(t *testing.T) {
	res, _, err := scriptsOf(t, map[string]string{
		"Procfile": "web: ./server --port $PORT\n",
		"app.json": `{"scripts": {"dokku": {"predeploy": "./migrate up"}}}`,
	}, false)
	if err != nil || strings.Join(res.Predeploy, " ") != "./migrate up" || res.Release != nil {
		t.Fatalf("predeploy %q release %q, %v", res.Predeploy, res.Release, err)
	}
	// Without a shell, a config var in the command line could only be put there
	// by the build, where its records would keep it: refused, with what to do.
	_, _, err = scriptsOf(t, map[string]string{
		"Procfile": "web: ./server\n",
		"app.json": `{"scripts": {"dokku": {"predeploy": "./migrate $DATABASE_URL"}}}`,
	}, false)
	if err == nil || err.Error() != "app.json: scripts.dokku.predeploy: $DATABASE_URL: the image has no shell, so the command cannot read config vars; run a script that does, or give the image a shell" {
		t.Errorf("got %v", err)
	}
}

func TestAppJSONErrorsAndLinks(t *testing.T) {
	if _, _, err := scriptsOf(t, map[string]string{"app.json": "{\n\"cron\": 3}"}, true); err == nil ||
		err.Error() != "app.json line 2: cron: is a number, and it should be a list of jobs" {
		t.Errorf("got %v", err)
	}
	if _, _, err := scriptsOf(t, map[string]string{"app.json": `{"a": "` + strings.Repeat("x", 70<<10) + `"}`}, true); err == nil ||
		!strings.Contains(err.Error(), "bex reads at most 65536") {
		t.Errorf("big app.json: %v", err)
	}
	// A link out of the tree is not followed.
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"cron": [{"command": "x", "schedule": "@daily"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "app.json")); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	res := &Result{}
	err = scripts(root, &plan.Plan{Shell: true}, &bytes.Buffer{}, res)
	if err == nil || res.AppJSON != nil || !strings.Contains(err.Error(), "app.json cannot be read") {
		t.Errorf("a link out of the tree: %v, %+v", err, res.AppJSON)
	}
}
