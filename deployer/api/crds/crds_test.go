package crds_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"bex.co/bex/deployer/api/crds"
)

// TestGeneratedFilesAreFresh regenerates the CRDs and the deepcopy functions into a
// temporary directory with the same controller-gen invocation as `make generate`,
// and fails when the committed ones differ.
func TestGeneratedFilesAreFresh(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("go", "tool", "controller-gen",
		"object", "paths=./api/...", "output:object:dir="+out,
		"crd", "output:crd:dir="+filepath.Join(out, "crds"))
	cmd.Dir = filepath.Join("..", "..") // the deployer directory
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, msg)
	}
	compare := func(generated, committed string) {
		t.Helper()
		want, err := os.ReadFile(generated)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(committed)
		if err != nil {
			t.Fatalf("%s: %v (run `make generate`)", committed, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make generate` and commit the result", committed)
		}
	}
	compare(filepath.Join(out, "zz_generated.deepcopy.go"), "../v1alpha1/zz_generated.deepcopy.go")
	names, err := filepath.Glob(filepath.Join(out, "crds", "*.yaml"))
	if err != nil || len(names) == 0 {
		t.Fatalf("controller-gen wrote no CRDs (%v)", err)
	}
	committed, _ := filepath.Glob("*.yaml")
	if len(committed) != len(names) {
		t.Errorf("committed CRDs %v, generated %d: run `make generate`", committed, len(names))
	}
	for _, name := range names {
		compare(name, filepath.Base(name))
	}
}

func TestAllParsesEveryKind(t *testing.T) {
	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, crd := range all {
		kinds[crd.Spec.Names.Kind] = string(crd.Spec.Scope)
	}
	want := map[string]string{"App": "Namespaced", "Database": "Namespaced", "Release": "Namespaced", "User": "Cluster"}
	for kind, scope := range want {
		if kinds[kind] != scope {
			t.Errorf("kind %s: scope %q, want %q (all: %v)", kind, kinds[kind], scope, kinds)
		}
	}
	if len(kinds) != len(want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
}
