package plan_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"bex.co/bex/builder/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenPlan is what plan.golden.json holds: the Plan without its Dockerfile (which
// has its own golden file, to be read as a Dockerfile), plus the argv of each process.
type goldenPlan struct {
	Stack     string              `json:"stack"`
	Shell     bool                `json:"shell"`
	Processes map[string]string   `json:"processes,omitempty"`
	Commands  map[string][]string `json:"commands,omitempty"`
	Notes     []string            `json:"notes"`
}

// TestGolden detects each testdata/<case>/src tree with the production images and
// compares the result with the case's golden files: Dockerfile.golden and
// plan.golden.json, or error.golden for a tree that must fail. `go test
// ./builder/plan -update` rewrites them.
//
// The Go, Node and Python plans are checked here only: their official base images
// cannot be pulled in the test environment, which has no registry. The static and
// Procfile-only plans are also built and run on a real BuildKit (build_test.go).
func TestGolden(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", name)
			p, err := plan.Detect(os.DirFS(filepath.Join(dir, "src")), plan.DefaultConfig())
			errFile := filepath.Join(dir, "error.golden")
			dockerfile := filepath.Join(dir, "Dockerfile.golden")
			planFile := filepath.Join(dir, "plan.golden.json")
			if *update {
				for _, f := range []string{errFile, dockerfile, planFile} {
					if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
						t.Fatal(err)
					}
				}
				if err != nil {
					writeFile(t, errFile, err.Error()+"\n")
					return
				}
				writeFile(t, dockerfile, p.Dockerfile)
				writeFile(t, planFile, string(planJSON(t, p)))
				return
			}
			if want, rerr := os.ReadFile(errFile); rerr == nil {
				if err == nil {
					t.Fatalf("Detect succeeded (stack %s), want the error %q", p.Stack, strings.TrimSpace(string(want)))
				}
				if got := err.Error() + "\n"; got != string(want) {
					t.Fatalf("error:\n got: %s\nwant: %s", got, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			compare(t, dockerfile, p.Dockerfile)
			compare(t, planFile, string(planJSON(t, p)))
		})
	}
}

func planJSON(t *testing.T, p *plan.Plan) []byte {
	t.Helper()
	g := goldenPlan{Stack: p.Stack, Shell: p.Shell, Processes: p.Processes, Notes: p.Notes}
	for name := range p.Processes {
		argv, err := p.Command(name)
		if err != nil {
			t.Fatalf("Command(%q): %v", name, err)
		}
		if g.Commands == nil {
			g.Commands = map[string][]string{}
		}
		g.Commands[name] = argv
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // commands read as written: &&, not \u0026\u0026
	enc.SetIndent("", "  ")
	if err := enc.Encode(g); err != nil { // maps are written sorted by key
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func compare(t *testing.T, path, got string) {
	t.Helper()
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./builder/plan -update` to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run `go test ./builder/plan -update` and review the diff):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestDetectErrors pins the exact sentences users read when their app cannot be
// planned. (The golden error cases hold some of them too, but -update rewrites those.)
func TestDetectErrors(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	tests := []struct {
		name string
		src  fstest.MapFS
		want string
	}{
		{
			"nothing detected",
			fstest.MapFS{"README.md": file("hi"), "docs/index.html": file("<p>not at the root</p>")},
			"no Dockerfile and no known stack: looked for go.mod, Gemfile, composer.json, index.php, package.json, requirements.txt, pyproject.toml, index.html and Procfile; add a Dockerfile, or one of these files",
		},
		{
			"Procfile line without a colon",
			fstest.MapFS{"index.html": file("x"), "Procfile": file("# processes\nweb: ./server\n./worker\n")},
			"Procfile line 3: \"./worker\" is not a process: a line is a name and a command, such as `web: ./server`",
		},
		{
			"Procfile bad name",
			fstest.MapFS{"Procfile": file("Web: ./server\n")},
			"Procfile line 1: \"Web\" is not a process type name: use lower-case letters, digits and '-', starting with a letter and at most 30 characters (web, worker, release), as in `web: ./server`",
		},
		{
			"Procfile duplicate",
			fstest.MapFS{"Procfile": file("web: a\nworker: b\nweb: c\n")},
			"Procfile line 3: process \"web\" is already defined on line 1: keep one of the two",
		},
		{
			"Procfile with no processes and nothing else",
			fstest.MapFS{"Procfile": file("# nothing yet\n")},
			"the Procfile lists no processes, and bex found no other stack: add a line such as `web: ./server` to the Procfile, or add a Dockerfile",
		},
		{
			"package.json not JSON",
			fstest.MapFS{"package.json": file("{\n  \"name\": \"x\",\n  \"scripts\": {\"start\": \"node s.js\",}\n}\n")},
			"package.json is not valid JSON: invalid character '}' looking for beginning of object key string (line 3, column 36)",
		},
		{
			"package.json cut short",
			fstest.MapFS{"package.json": file(`{"name": "x"`)},
			"package.json is not valid JSON: it ends before the object is closed",
		},
		{
			"package.json not an object",
			fstest.MapFS{"package.json": file(`["x"]`)},
			`package.json is not valid JSON for a package: it must hold an object, such as {"scripts": {"start": "node server.js"}}`,
		},
		{
			"node without a start",
			fstest.MapFS{"package.json": file(`{"scripts": {"build": "tsc"}}`)},
			`package.json has no "start" script and there is no server.js or index.js: add a "start" script to package.json, or a Procfile with a web process (web: node app.js)`,
		},
		{
			"python without a start",
			fstest.MapFS{"requirements.txt": file("django\n"), "manage.py": file("")},
			"no start command for this Python app: add a Procfile with a web process (web: gunicorn app:app), or an app.py or main.py",
		},
		{
			"go without a main package",
			fstest.MapFS{"go.mod": file("module x\n"), "lib.go": file("package lib\n")},
			"go.mod found, but no main package to build: bex builds the package at the root of the module, or the one cmd/NAME/main.go, and found neither; add a Dockerfile to build another package",
		},
		{
			"go with several commands",
			fstest.MapFS{"go.mod": file("module x\n"), "cmd/b/main.go": file("package main\n"), "cmd/a/main.go": file("package main\n")},
			"go.mod found, but no main package at the root and several commands under cmd/ (cmd/a, cmd/b): put the app's main package at the root, or add a Dockerfile that builds the one to run",
		},
		{
			"go Procfile with shell syntax",
			fstest.MapFS{"go.mod": file("module x\n"), "main.go": file("package main\n"), "Procfile": file("web: /app | tee log\n")},
			"Procfile line 1: the web command cannot run because it uses shell syntax (|), and a Go app's image has no shell: write a plain command such as `web: /app -addr :$PORT`, or add a Dockerfile",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := plan.Detect(tt.src, plan.DefaultConfig())
			if err == nil {
				t.Fatalf("Detect succeeded (stack %s)", p.Stack)
			}
			if err.Error() != tt.want {
				t.Fatalf("error:\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
}

func TestNothingDetectedIsErrNothingDetected(t *testing.T) {
	_, err := plan.Detect(fstest.MapFS{}, plan.DefaultConfig())
	if !errors.Is(err, plan.ErrNothingDetected) {
		t.Fatalf("err = %v, want ErrNothingDetected", err)
	}
	// Other errors are not "nothing detected": the caller tells them apart.
	_, err = plan.Detect(fstest.MapFS{"package.json": {Data: []byte("{")}}, plan.DefaultConfig())
	if err == nil || errors.Is(err, plan.ErrNothingDetected) {
		t.Fatalf("err = %v, want a package.json error", err)
	}
}

func TestDetectRejectsABadConfig(t *testing.T) {
	cfg := plan.DefaultConfig()
	cfg.Images.Static = "busybox\nRUN rm -rf /"
	_, err := plan.Detect(fstest.MapFS{"index.html": {Data: []byte("x")}}, cfg)
	if err == nil || !strings.Contains(err.Error(), "Images.Static") {
		t.Fatalf("err = %v, want one about Images.Static", err)
	}
}

// TestDetectIsDeterministic detects the same tree many times: map iteration and the
// like must not show in the output.
func TestDetectIsDeterministic(t *testing.T) {
	src := os.DirFS(filepath.Join("testdata", "go-procfile", "src"))
	first, err := plan.Detect(src, plan.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		p, err := plan.Detect(src, plan.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		if p.Dockerfile != first.Dockerfile || !slices.Equal(p.Notes, first.Notes) {
			t.Fatalf("a second Detect differs:\n%s\n%v\nvs\n%s\n%v", p.Dockerfile, p.Notes, first.Dockerfile, first.Notes)
		}
	}
}

// TestImagesComeFromConfig checks that every FROM of every plan is one of the
// configured images, so that tests and air-gapped installs control what is pulled.
func TestImagesComeFromConfig(t *testing.T) {
	cfg := plan.Config{Images: plan.Images{
		Go: "local/go", Node: "local/node", Python: "local/python",
		Static: "local/static", Runtime: "local/runtime", Stack: "local/stack",
		Ruby: "local/ruby", PHP: "local/php", Composer: "local/composer",
	}}
	want := map[string][]string{
		"go-root":             {"local/go AS build", "local/runtime"},
		"node-npm":            {"local/node"},
		"python-requirements": {"local/python"},
		"static":              {"local/static"},
		"procfile-only":       {"local/stack"},
		"procfile-python":     {"local/stack"},
		"ruby-rack":           {"local/ruby"},
		"ruby-rails":          {"local/ruby"},
		"php-composer":        {"local/composer AS vendor", "local/php"},
		"php-plain":           {"local/php"},
	}
	for name, froms := range want {
		p, err := plan.Detect(os.DirFS(filepath.Join("testdata", name, "src")), cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for _, line := range strings.Split(p.Dockerfile, "\n") {
			if from, ok := strings.CutPrefix(line, "FROM "); ok {
				got = append(got, from)
			}
		}
		if !slices.Equal(got, froms) {
			t.Errorf("%s: FROM lines %q, want %q", name, got, froms)
		}
	}
}

// TestLinksStayInTheTree: a pushed tree may hold links. Those that stay inside it are
// followed; one that leads out must not make the planner read a file of the host.
func TestLinksStayInTheTree(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret"), "root:x:0:0:root:/root:/bin/sh\n")
	link := func(t *testing.T, target, name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("inside", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "index.html"), "<p>hi</p>")
		if err := os.MkdirAll(filepath.Join(dir, "deploy"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "deploy", "Procfile"), "web: ./serve\n")
		link(t, "deploy/Procfile", filepath.Join(dir, "Procfile"))
		link(t, "../deploy", filepath.Join(dir, "config", "d")) // a link to a directory, through ..
		link(t, "../config/d/Procfile", filepath.Join(dir, "etc", "Procfile"))
		p, err := plan.Detect(os.DirFS(dir), plan.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		if p.Processes["web"] != "./serve" {
			t.Fatalf("processes %q, want the linked Procfile's", p.Processes)
		}
		if procs, err := plan.ReadProcfile(os.DirFS(filepath.Join(dir, "etc"))); err == nil {
			t.Fatalf("ReadProcfile of etc/ followed ../config out of its root: %q", procs)
		}
	})

	for name, target := range map[string]string{
		"absolute":       filepath.Join(outside, "secret"),
		"above the root": "../" + filepath.Base(outside) + "/secret",
	} {
		t.Run(name, func(t *testing.T) {
			parent := filepath.Dir(outside)
			dir, err := os.MkdirTemp(parent, "app-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			link(t, target, filepath.Join(dir, "Procfile"))
			if _, err := os.Stat(filepath.Join(dir, "Procfile")); err != nil {
				t.Fatalf("the link does not reach the file: %v", err) // else the test proves nothing
			}
			_, err = plan.Detect(os.DirFS(dir), plan.DefaultConfig())
			want := "Procfile cannot be read because it is a link that leads outside the app: bex reads only the app's own files; put the file itself in its place"
			if err == nil || err.Error() != want {
				t.Fatalf("err = %v, want %q", err, want)
			}
			// The same for an app with its own Dockerfile.
			if procs, err := plan.ReadProcfile(os.DirFS(dir)); err == nil || err.Error() != want {
				t.Fatalf("ReadProcfile: %q, %v, want %q", procs, err, want)
			}
		})
	}

	t.Run("a directory on the way", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(outside, "server"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(outside, "server", "main.go"), "package main\n")
		writeFile(t, filepath.Join(dir, "go.mod"), "module x\n")
		link(t, outside, filepath.Join(dir, "cmd"))
		_, err := plan.Detect(os.DirFS(dir), plan.DefaultConfig())
		want := "cmd/ cannot be read because it is a link that leads outside the app: bex reads only the app's own files; put the directory itself in its place"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})
}
