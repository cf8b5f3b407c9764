package builder

import (
	"bytes"
	"os"
	"path/filepath"
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

func TestProcfileReleaseIsTheReleaseCommand(t *testing.T) {
	res, out, err := scriptsOf(t, map[string]string{
		"Procfile": "web: ./server\nrelease: ./migrate --all\n",
		"app.json": `{"name": "x", "scripts": {"dokku": {"predeploy": "./other", "postdeploy": "./warm"}}, "cron": [{"command": "./r", "schedule": "@daily"}]}`,
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Processes["release"]; ok || len(res.Processes) != 1 {
		t.Errorf("processes %v", res.Processes)
	}
	if strings.Join(res.Release, " ") != "sh -c exec ./migrate --all" || strings.Join(res.Postdeploy, " ") != "sh -c exec ./warm" {
		t.Errorf("release %q postdeploy %q", res.Release, res.Postdeploy)
	}
	if res.AppJSON == nil || len(res.AppJSON.Cron) != 1 {
		t.Errorf("app.json %+v", res.AppJSON)
	}
	for _, w := range []string{`app.json: "name" is ignored: bex does not read it`, "scripts.dokku.predeploy is ignored: the Procfile's release: runs instead"} {
		if !strings.Contains(out, w) {
			t.Errorf("no %q in %q", w, out)
		}
	}
}

func TestPredeployWithoutShell(t *testing.T) {
	res, _, err := scriptsOf(t, map[string]string{
		"Procfile": "web: ./server --port $PORT\n",
		"app.json": `{"scripts": {"dokku": {"predeploy": "./migrate up"}}}`,
	}, false)
	if err != nil || strings.Join(res.Release, " ") != "./migrate up" {
		t.Fatalf("release %q, %v", res.Release, err)
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
