package infra

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"bex.co/bex/internal/testenv"
)

// TestInstallScriptManifests: what hack/install-bex.sh applies (its --print) has
// the image and the settings it was given, and passes the server-side dry-run.
func TestInstallScriptManifests(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectlBin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack/install-bex.sh"), "--print")
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectlBin, "BEX_IMAGE=registry.example.com:5000/team/bex:v1.2",
		"BASE_DOMAIN=apps.example.org", "ACME_EMAIL=ops@example.org")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("hack/install-bex.sh --print: %v\n%s", err, stderr)
	}
	images, config := 0, map[string]any{}
	var helper []string
	for _, obj := range objects(t, out) {
		if obj.GetKind() == "ConfigMap" && obj.GetName() == "bex-config" {
			config = obj.Object["data"].(map[string]any)
		}
		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			if c.(map[string]any)["image"] == "registry.example.com:5000/team/bex:v1.2" {
				images++
			}
			env, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
			for _, e := range env {
				if e.(map[string]any)["name"] == "BEX_VOLUME_HELPER_IMAGE" {
					helper = append(helper, fmt.Sprint(e.(map[string]any)["value"]))
				}
			}
		}
	}
	// The helper pods of volumes' backups run the gitserver's own image.
	if len(helper) != 1 || helper[0] != "registry.example.com:5000/team/bex:v1.2" {
		t.Errorf("BEX_VOLUME_HELPER_IMAGE %q, want the given image once (the gitserver's)", helper)
	}
	if images != 3 {
		t.Errorf("%d containers run the given image, want 3 (deployer, gitserver, edge)", images)
	}
	for k, want := range map[string]string{"BEX_BASE_DOMAIN": "apps.example.org", "BEX_ACME_EMAIL": "ops@example.org", "BEX_SSH_URL": "ssh://git@git.apps.example.org",
		"BEX_HOOKS_URL": "https://apps.example.org"} {
		if config[k] != want {
			t.Errorf("bex-config %s = %v, want %s", k, config[k], want)
		}
	}
	cp := controlPlane(t)
	ensureNamespaces(t, cp)
	if err := dryRun(t, cp, "", out); err != nil {
		t.Fatal(err)
	}
}
