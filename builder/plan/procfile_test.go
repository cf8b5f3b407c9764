package plan_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"bex.co/bex/builder/plan"
)

func TestParseProcfile(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string
	}{
		{"one web", "web: ./server\n", map[string]string{"web": "./server"}},
		{"no final newline", "web: ./server", map[string]string{"web": "./server"}},
		{"empty file", "", map[string]string{}},
		{"only comments", "# nothing\n\n   # indented\n", map[string]string{}},
		{
			"several, with comments and blank lines",
			"# the app\nweb: bundle exec puma -p $PORT\n\nworker:   bin/worker --queue=default  \nrelease: ./migrate\n",
			map[string]string{"web": "bundle exec puma -p $PORT", "worker": "bin/worker --queue=default", "release": "./migrate"},
		},
		{"colons in the command", "web: ./server --listen=:$PORT --db=postgres://h:5432/x", map[string]string{"web": "./server --listen=:$PORT --db=postgres://h:5432/x"}},
		{"no space after the colon", "web:./server", map[string]string{"web": "./server"}},
		{"CRLF", "web: ./server\r\nworker: ./worker\r\n", map[string]string{"web": "./server", "worker": "./worker"}},
		{"BOM", "\ufeffweb: ./server\n", map[string]string{"web": "./server"}},
		{"names with digits and dashes", "web-2: a\nq1: b\n", map[string]string{"web-2": "a", "q1": "b"}},
		{"a # in the command is the command's", "web: ./server # listens on PORT", map[string]string{"web": "./server # listens on PORT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := plan.ParseProcfile([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReadProcfile(t *testing.T) {
	procs, err := plan.ReadProcfile(fstest.MapFS{"Procfile": {Data: []byte("web: ./s\n")}})
	if err != nil || !maps.Equal(procs, map[string]string{"web": "./s"}) {
		t.Fatalf("got %q, %v", procs, err)
	}
	if procs, err := plan.ReadProcfile(fstest.MapFS{"Dockerfile": {}}); err != nil || procs != nil {
		t.Fatalf("no Procfile: got %q, %v; want nil, nil", procs, err)
	}
	if _, err := plan.ReadProcfile(fstest.MapFS{"Procfile": {Data: []byte("Web: x")}}); err == nil {
		t.Fatal("a bad Procfile was accepted")
	}
}

func TestParseProcfileErrors(t *testing.T) {
	var many strings.Builder
	for i := range 21 {
		fmt.Fprintf(&many, "p%d: run\n", i)
	}
	tests := []struct {
		name, in, want string
	}{
		{"no colon", "web ./server", "Procfile line 1: \"web ./server\" is not a process: a line is a name and a command, such as `web: ./server`"},
		{"no name", "\n: ./server", "Procfile line 2: \": ./server\" is not a process: a line is a name and a command, such as `web: ./server`"},
		{"upper case", "Web: ./server", "Procfile line 1: \"Web\" is not a process type name: use lower-case letters, digits and '-', starting with a letter and at most 30 characters (web, worker, release), as in `web: ./server`"},
		{"underscore", "web_1: x", `Procfile line 1: "web_1" is not a process type name`},
		{"starts with a digit", "1web: x", `Procfile line 1: "1web" is not a process type name`},
		{"ends with a dash", "web-: x", `Procfile line 1: "web-" is not a process type name`},
		{"space in the name", "my web: x", `Procfile line 1: "my web" is not a process type name`},
		{"too long", strings.Repeat("w", 31) + ": x", `is not a process type name`},
		{"no command", "# c\nweb:   \n", "Procfile line 2: process \"web\" has no command: write it after the colon, as in `web: ./server`"},
		{"duplicate", "web: a\n\nweb: b\n", "Procfile line 3: process \"web\" is already defined on line 1: keep one of the two"},
		{"too many", many.String(), "Procfile line 21: the Procfile defines 21 process types, and an app has at most 20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := plan.ParseProcfile([]byte(tt.in))
			if err == nil {
				t.Fatalf("parsed as %q, want an error", got)
			}
			if !strings.HasPrefix(err.Error(), tt.want) && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
	// The longest name the App API accepts is accepted here too.
	if _, err := plan.ParseProcfile([]byte(strings.Repeat("w", 30) + ": x")); err != nil {
		t.Fatalf("30-character name: %v", err)
	}
}

// TestCommandWithShell: the image has sh. A simple command gets exec in front, so that
// the app is PID 1 and gets SIGTERM; anything else is left to the shell as written.
// `$(` and `$$` are escaped for Kubernetes' expansion of the command.
func TestCommandWithShell(t *testing.T) {
	tests := []struct{ command, script string }{
		{"./server", "exec ./server"},
		{`./server -addr ":$PORT"`, `exec ./server -addr ":$PORT"`},
		{"exec ./server", "exec ./server"},
		{"bundle exec puma -C config/puma.rb", "exec bundle exec puma -C config/puma.rb"},
		{"./migrate && ./server", "./migrate && ./server"},
		{"./server | tee log", "./server | tee log"},
		{"./server > log", "./server > log"},
		{"./a; ./b", "./a; ./b"},
		{"FOO=1 ./server", "FOO=1 exec ./server"},
		{`A="x y" B='$z'  node s.js`, `A="x y" B='$z'  exec node s.js`},
		{`A="x \" y" node s.js`, `A="x \" y" exec node s.js`},
		{"A=1", "A=1"},
		{"A=1 cd /", "A=1 cd /"},
		{`A="unclosed node s.js`, `A="unclosed node s.js`},
		{"=x ./s", "exec =x ./s"},
		{"cd web", "cd web"},
		{"export A=1", "export A=1"},
		{"if true; then ./s; fi", "if true; then ./s; fi"},
		{"echo $(date)", "echo $$(date)"},
		{"echo $$", "exec echo $$$"},
		{"echo ${PORT:-8080}", "exec echo ${PORT:-8080}"},
	}
	for _, tt := range tests {
		p := &plan.Plan{Shell: true, Processes: map[string]string{"web": tt.command}}
		got, err := p.Command("web")
		if err != nil {
			t.Fatalf("%q: %v", tt.command, err)
		}
		if want := []string{"sh", "-c", tt.script}; !slices.Equal(got, want) {
			t.Errorf("%q: got %q, want %q", tt.command, got, want)
		}
	}
}

// TestCommandWithoutShell: a Go image has no shell. The command is split into words as
// sh would split it, variables become Kubernetes references, and what only a shell
// can run is an error.
func TestCommandWithoutShell(t *testing.T) {
	tests := []struct {
		command string
		want    []string
	}{
		{"/app", []string{"/app"}},
		{"  /app   -v  ", []string{"/app", "-v"}},
		{"/app -addr :$PORT", []string{"/app", "-addr", ":$(PORT)"}},
		{`/app -addr ":${PORT}"`, []string{"/app", "-addr", ":$(PORT)"}},
		{`/app -greeting "hello world" -name 'it''s'`, []string{"/app", "-greeting", "hello world", "-name", "its"}},
		{`/app -literal '$PORT'`, []string{"/app", "-literal", "$$PORT"}},
		{`/app -price 5$`, []string{"/app", "-price", "5$$"}},
		{`/app -empty ""`, []string{"/app", "-empty", ""}},
		{`/app a\ b "q\"uote" "back\slash"`, []string{"/app", "a b", `q"uote`, `back\slash`}},
		{`/app "a|b;c&d"`, []string{"/app", "a|b;c&d"}},
		{`/app -dsn=$DATABASE_URL`, []string{"/app", "-dsn=$(DATABASE_URL)"}},
	}
	for _, tt := range tests {
		p := &plan.Plan{Processes: map[string]string{"web": tt.command}}
		got, err := p.Command("web")
		if err != nil {
			t.Fatalf("%q: %v", tt.command, err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q: got %q, want %q", tt.command, got, tt.want)
		}
	}
	bad := map[string]string{
		"/app | tee log":      "shell syntax (|)",
		"/app && /app -x":     "shell syntax (&)",
		"/app > log":          "shell syntax (>)",
		"/app $(date)":        "shell syntax ($()",
		"/app `date`":         "shell syntax (`)",
		"/app ${PORT:-8080}":  "shell syntax (${PORT:-8080})",
		"/app $1":             "shell syntax ($1)",
		"/app $$":             "shell syntax ($$)",
		`/app "unterminated`:  `a " quote is not closed`,
		`/app trailing\`:      `lone \`,
		"/app ${PORT":         "a ${ is not closed",
		`/app "$(whoami)"`:    "shell syntax ($()",
		"(/app)":              "shell syntax (()",
		"/app; /app -restart": "shell syntax (;)",
	}
	for command, want := range bad {
		p := &plan.Plan{Processes: map[string]string{"web": command}}
		got, err := p.Command("web")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "no shell") {
			t.Errorf("%q: got %q, %v; want an error about %s", command, got, err, want)
		}
	}
}

func TestCommandOfAnUnknownProcess(t *testing.T) {
	p := &plan.Plan{Shell: true, Processes: map[string]string{"web": "./s"}}
	if _, err := p.Command("worker"); err == nil || err.Error() != `the Procfile has no "worker" process` {
		t.Fatalf("err = %v", err)
	}
}
