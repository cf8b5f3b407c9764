package infra

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"bex.co/bex/internal/testenv"
)

// TestManifestsUseFlagsTheBinaryHas: every flag that infra/bex passes to a bex
// command, and every BEX_ variable of its ConfigMap, is one that bex (built from
// this tree) knows; a renamed flag fails here rather than in a crash-looping pod.
func TestManifestsUseFlagsTheBinaryHas(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "bex")
	build := exec.Command("go", "build", "-o", bin, "./cmd/bex")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/bex: %v\n%s", err, out)
	}
	help := map[string]string{}
	flagsOf := func(sub string) string {
		if h, ok := help[sub]; ok {
			return h
		}
		out, err := exec.Command(bin, sub, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("bex %s --help: %v\n%s", sub, err, out)
		}
		help[sub] = string(out)
		return help[sub]
	}
	flagName := regexp.MustCompile(`^--([a-z0-9-]+)`)
	var usesConfig []string
	var config map[string]any
	for _, obj := range objects(t, render(t, "bex")) {
		if obj.GetKind() == "ConfigMap" && obj.GetName() == "bex-config" {
			config, _, _ = unstructured.NestedMap(obj.Object, "data")
		}
		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			c := c.(map[string]any)
			if !strings.HasPrefix(c["image"].(string), "bex.local/bex") {
				continue
			}
			args, _ := c["args"].([]any)
			if len(args) == 0 {
				t.Errorf("%s %s: the bex container names no command", obj.GetKind(), obj.GetName())
				continue
			}
			sub := args[0].(string)
			h := flagsOf(sub)
			for _, a := range args[1:] {
				m := flagName.FindStringSubmatch(a.(string))
				if m == nil {
					t.Errorf("%s %s: argument %q is no flag", obj.GetKind(), obj.GetName(), a)
					continue
				}
				if !strings.Contains(h, "--"+m[1]+" ") {
					t.Errorf("%s %s: bex %s has no flag --%s", obj.GetKind(), obj.GetName(), sub, m[1])
				}
			}
			if envFrom, _ := c["envFrom"].([]any); len(envFrom) > 0 {
				usesConfig = append(usesConfig, sub)
			}
		}
	}
	if config == nil || len(usesConfig) == 0 {
		t.Fatalf("no bex-config ConfigMap, or no component reads it (%v)", usesConfig)
	}
	for name := range config {
		flag := "--" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "BEX_")), "_", "-") + " "
		known := false
		for _, sub := range usesConfig {
			known = known || strings.Contains(flagsOf(sub), flag)
		}
		if !strings.HasPrefix(name, "BEX_") || !known {
			t.Errorf("bex-config sets %s, which is the flag %s of none of %v", name, strings.TrimSpace(flag), usesConfig)
		}
	}
}
