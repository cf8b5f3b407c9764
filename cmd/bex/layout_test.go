package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The layout's two rules (docs/architecture.md, "Layout"): the top level holds
// what the design names and nothing else, and a component imports no other
// component, the API packages (deployer/api/...: the types and their CRDs) being
// the one exception; and internal/, shared helpers and the one-machine platform,
// imports no component at all but the API packages.

const module = "bex.co/bex"

var components = []string{"gitserver", "builder", "deployer", "edge"}

func TestTopLevelIsTheDesignedOne(t *testing.T) {
	want := []string{".ci", ".gitignore", "Makefile", "README.md", "builder", "cmd", "deployer", "docs",
		"edge", "gitserver", "go.mod", "go.sum", "hack", "infra", "internal"}
	cmd := exec.Command("git", "ls-files")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		top, _, _ := strings.Cut(f, "/")
		if !seen[top] && !slices.Contains(want, top) {
			t.Errorf("the top level has %s, which the design does not name: put it under one of %s", top, strings.Join(want, " "))
		}
		seen[top] = true
	}
}

func TestComponentsImportNoOtherComponent(t *testing.T) {
	for _, c := range components {
		cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./"+c+"/...")
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", c, err)
		}
		for _, p := range strings.Fields(string(out)) {
			rest, ok := strings.CutPrefix(p, module+"/")
			if !ok || isAPI(rest) || strings.HasPrefix(rest, c+"/") || rest == c {
				continue
			}
			for _, other := range components {
				if rest == other || strings.HasPrefix(rest, other+"/") {
					t.Errorf("%s imports %s, a package of %s: declare the small interface it needs in %s and let cmd/bex wire it", c, p, other, c)
				}
			}
		}
	}
}

// isAPI says whether a package (its path under the module) is the shared contract:
// the API types and their generated CRDs.
func isAPI(rest string) bool { return strings.HasPrefix(rest, "deployer/api/") }

func TestInternalImportsNoComponent(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./internal/...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list internal: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		from, ok := strings.CutPrefix(fields[0], module+"/internal/")
		if !ok {
			continue
		}
		from, _, _ = strings.Cut(from, " ") // a test variant: "pkg [pkg.test]"
		for _, p := range fields[1:] {
			rest, ok := strings.CutPrefix(p, module+"/")
			if !ok || isAPI(rest) {
				continue
			}
			for _, c := range components {
				if rest == c || strings.HasPrefix(rest, c+"/") {
					t.Errorf("internal/%s imports %s, a package of %s: internal/ holds what no component owns, so it takes what it needs from a component as an argument or an interface", from, p, c)
				}
			}
		}
	}
}

// The gitserver is built bottom up (docs/architecture.md, "The gitserver's
// layers"): its pipeline (gitserver/pipeline) is made first and handed, as a
// value, to the backend and to the SSH server; the backend and the pipeline
// import neither the SSH server (bex.co/bex/gitserver) nor its front-ends, and
// cmd/bex hands the backend no closure that returns the server made after it.
func TestTheGitserverIsBuiltBottomUp(t *testing.T) {
	for _, low := range []string{"gitserver/pipeline", "gitserver/backend", "gitserver/storage"} {
		cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./"+low)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", low, err)
		}
		for _, p := range strings.Fields(string(out)) {
			for _, high := range []string{"gitserver", "gitserver/sshcmd", "gitserver/mcpserver", "gitserver/webhook", "gitserver/access"} {
				if p == module+"/"+high {
					t.Errorf("%s imports %s: the lower layer calls no layer above it", low, p)
				}
			}
		}
	}
	// A late-bound closure is a func literal returning the server (or the
	// pipeline) that a value made before it calls once the server exists.
	late := regexp.MustCompile(`func\s*\(\)\s*\*\s*(gitserver\.Server|pipeline\.Pipeline)\b`)
	eachSourceLine(t, func(f string, n int, line string) {
		if late.MatchString(line) {
			t.Errorf("%s:%d: %s: a closure that returns the server made later; make the pipeline first and hand it as a value", f, n, strings.TrimSpace(line))
		}
	})
}

// TestThePushIsAdmittedByTheBackend: who may push, and whether a push may
// create its app, is the backend's decision (backend.AdmitPush and
// CreatePushedApp, the SSH server's Admission); the push carries it and asks no
// access rule itself.
func TestThePushIsAdmittedByTheBackend(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "gitserver", "push.go"))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(src), "\n") {
		for _, rule := range []string{".MayUse(", ".CanCreateApps", ".Admin"} {
			if strings.Contains(line, rule) {
				t.Errorf("gitserver/push.go:%d: %s: a push's access is decided by the backend (AdmitPush), not by the SSH server", i+1, strings.TrimSpace(line))
			}
		}
	}
}

// runtimeChoice is a comparison of --runtime's value: with a runtime's name
// (== "local", case "kubernetes", ...) or of the fields that hold the flag.
var runtimeChoice = regexp.MustCompile(`(==|!=)\s*"(local|kubernetes)"|"(local|kubernetes)"\s*(==|!=)|case\s+"(local|kubernetes)"|\.(runtime|runtimeName)\s*(==|!=)|switch\s+[\w.]*\.(runtime|runtimeName)\b`)

// TestRuntimeIsChosenOnce: --runtime is compared in runtime.go only, whose one
// switch names each runtime once; everything that depends on the runtime is
// made there, not chosen again where it is used.
func TestRuntimeIsChosenOnce(t *testing.T) {
	cases := 0
	eachSourceLine(t, func(f string, n int, line string) {
		if !runtimeChoice.MatchString(line) {
			return
		}
		if f != "runtime.go" {
			t.Errorf("%s:%d chooses by --runtime (%s): let runtime.go's runtimeKind make what depends on the runtime", f, n, strings.TrimSpace(line))
			return
		}
		cases++
	})
	if cases != 2 {
		t.Errorf("runtime.go compares --runtime %d times: want one switch with a case for local and one for kubernetes", cases)
	}
}

// eachSourceLine calls f with each line (numbered from 1) of cmd/bex's non-test
// Go files.
func eachSourceLine(t *testing.T, f func(file string, n int, line string)) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			f(file, i+1, line)
		}
	}
}
