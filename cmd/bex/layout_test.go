package main

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The layout's two rules (docs/architecture.md, "Layout"): the top level holds
// what the design names and nothing else, and a component imports no other
// component, the API package (deployer/api/v1alpha1) being the one exception.

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
			if !ok || rest == "deployer/api/v1alpha1" || strings.HasPrefix(rest, c+"/") || rest == c {
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
