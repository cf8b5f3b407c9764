package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func runBex(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root, _ := newRoot(&out, &errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String() + errOut.String(), err
}

func TestVersion(t *testing.T) {
	out, err := runBex(t, "version")
	if err != nil {
		t.Fatalf("bex version: %v", err)
	}
	if !strings.HasPrefix(out, "bex "+version+" (go") {
		t.Fatalf("bex version printed %q", out)
	}
}

func TestVersionJSON(t *testing.T) {
	out, err := runBex(t, "version", "--json")
	if err != nil {
		t.Fatalf("bex version --json: %v", err)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("not JSON: %q: %v", out, err)
	}
	if v["version"] != version || v["go"] == "" || v["platform"] == "" {
		t.Fatalf("bex version --json = %v", v)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	_, err := runBex(t, "no-such-command")
	if err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("want an unknown-command error, got %v", err)
	}
}

func TestPlanPrintsTheGeneratedDockerfile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "index.html"), []byte("<h1>hi</h1>\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "Procfile"), []byte("web: httpd -f -p $PORT -h /srv\n"), 0o644)
	out, err := runBex(t, "plan", dir)
	if err != nil {
		t.Fatalf("bex plan: %v\n%s", err, out)
	}
	if !strings.Contains(out, "# stack: static") || !strings.Contains(out, "FROM ") || !strings.Contains(out, "# process web: httpd -f -p $PORT -h /srv") {
		t.Fatalf("bex plan printed:\n%s", out)
	}
	out, err = runBex(t, "plan", "--json", dir)
	var p struct {
		Stack      string `json:"stack"`
		Dockerfile string `json:"dockerfile"`
	}
	if err != nil || json.Unmarshal([]byte(out), &p) != nil || p.Stack != "static" || p.Dockerfile == "" {
		t.Fatalf("bex plan --json: %v\n%s", err, out)
	}
	empty := t.TempDir()
	if _, err := runBex(t, "plan", empty); err == nil || !strings.Contains(err.Error(), "no Dockerfile and no known stack") {
		t.Fatalf("bex plan of an empty directory: %v", err)
	}
	if _, err := runBex(t, "plan", filepath.Join(empty, "missing")); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("bex plan of a missing directory: %v", err)
	}
}

// TestLogFormat: --log-format (or BEX_LOG_FORMAT) picks the log's encoding;
// anything else is refused before a command runs.
func TestLogFormat(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"version"}, "", `level=INFO msg=hello`},
		{[]string{"--log-format", "json", "version"}, "", `"msg":"hello"`},
		{[]string{"version"}, "json", `"msg":"hello"`},
		{[]string{"--log-format", "text", "version"}, "json", `level=INFO msg=hello`},
	} {
		t.Setenv("BEX_LOG_FORMAT", c.env)
		if c.env == "" {
			os.Unsetenv("BEX_LOG_FORMAT")
		}
		var out, errOut bytes.Buffer
		root, logs := newRoot(&out, &errOut)
		root.SetArgs(c.args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		slog.New(logs).Info("hello")
		if !strings.Contains(errOut.String(), c.want) {
			t.Errorf("%v with BEX_LOG_FORMAT=%q logged %q, want %s", c.args, c.env, errOut.String(), c.want)
		}
	}
	if out, err := runBex(t, "--log-format", "yaml", "version"); err == nil || !strings.Contains(err.Error(), "want text or json") {
		t.Errorf("--log-format yaml: %v %q", err, out)
	}
}

// TestSayFollowsTheLogFormat: the lines a subcommand says on start (where it
// listens) are plain text with --log-format text and log records with json, so
// that a log collector reading stderr reads JSON only.
func TestSayFollowsTheLogFormat(t *testing.T) {
	t.Setenv("BEX_LOG_FORMAT", "")
	os.Unsetenv("BEX_LOG_FORMAT")
	for format, want := range map[string]string{"text": "bex x: listening on 1\n", "json": `"msg":"bex x: listening on 1"`} {
		var out, errOut bytes.Buffer
		root, logs := newRoot(&out, &errOut)
		root.SetArgs([]string{"--log-format", format, "version"})
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		say(&errOut, slog.New(logs), "bex x: listening on %d", 1)
		if got := errOut.String(); !strings.Contains(got, want) || format == "json" && !json.Valid([]byte(got)) {
			t.Errorf("--log-format %s: said %q, want %s", format, got, want)
		}
	}
}

// TestGoMemoryFlags: --go-memory-limit and --go-gc-percent set this process's Go
// runtime (how bex up tunes each component's memory), and a nonsense value is refused.
func TestGoMemoryFlags(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64); debug.SetGCPercent(100) })
	if out, err := runBex(t, "--go-memory-limit", "48Mi", "--go-gc-percent", "40", "version"); err != nil {
		t.Fatalf("bex version with Go memory flags: %v\n%s", err, out)
	}
	if got := debug.SetMemoryLimit(-1); got != 48<<20 {
		t.Errorf("memory limit %d, want %d", got, 48<<20)
	}
	if got := debug.SetGCPercent(100); got != 40 {
		t.Errorf("GC percent %d, want 40", got)
	}
	for _, args := range [][]string{{"--go-memory-limit", "lots"}, {"--go-gc-percent", "-5"}} {
		if out, err := runBex(t, append(args, "version")...); err == nil {
			t.Errorf("bex %v version: accepted\n%s", args, out)
		}
	}
}
