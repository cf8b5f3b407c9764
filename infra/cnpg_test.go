package infra

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"bex.co/bex/internal/testenv"
)

// cnpgModule is CloudNativePG's module at CNPG_VERSION, from the module cache
// (or the proxy, which serves the exact version).
func cnpgModule(t *testing.T) (dir, version string) {
	t.Helper()
	version = versions(t)["CNPG_VERSION"]
	if version == "" {
		t.Fatal("hack/versions.env names no CNPG_VERSION")
	}
	dir, err := moduleDir("github.com/cloudnative-pg/cloudnative-pg", version)
	if err != nil {
		t.Fatal(err)
	}
	return dir, version
}

// TestCNPGManifestsAreTheModules: infra/cnpg's CRDs are the module's
// config/crd/bases at CNPG_VERSION, byte for byte and all of them; its
// webhooks are upstream's (config/webhook, as config/default names them); its
// two ClusterRoles grant together exactly the rules of upstream's
// (config/rbac/role.yaml), some of them in fewer places; and the operator's
// image is upstream's of that version, the same in OPERATOR_IMAGE_NAME.
func TestCNPGManifestsAreTheModules(t *testing.T) {
	mod, version := cnpgModule(t)
	upstream, err := filepath.Glob(filepath.Join(mod, "config/crd/bases/*.yaml"))
	if err != nil || len(upstream) == 0 {
		t.Fatalf("no CRDs in %s/config/crd/bases (%v)", mod, err)
	}
	ours, _ := filepath.Glob(filepath.Join(infraDir(t), "cnpg/crds/*.yaml"))
	var names, ourNames []string
	for _, f := range upstream {
		names = append(names, filepath.Base(f))
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(infraDir(t), "cnpg/crds", filepath.Base(f)))
		if err != nil {
			t.Errorf("infra/cnpg/crds lacks %s of %s", filepath.Base(f), version)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("infra/cnpg/crds/%s is not the module's of %s", filepath.Base(f), version)
		}
	}
	for _, f := range ours {
		ourNames = append(ourNames, filepath.Base(f))
	}
	if !slices.Equal(names, ourNames) {
		t.Errorf("infra/cnpg/crds holds %v, the module %v", ourNames, names)
	}

	objs := objects(t, render(t, "cnpg"))
	var crds []string
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o.GetName())
		}
	}
	if len(crds) != len(upstream) {
		t.Errorf("infra/cnpg renders %d CRDs (%v), the module has %d: list each in kustomization.yaml", len(crds), crds, len(upstream))
	}

	// The webhooks: upstream's, with config/default's name prefix and namespace.
	raw, err := os.ReadFile(filepath.Join(mod, "config/webhook/manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range objects(t, raw) {
		whs, _, _ := unstructured.NestedSlice(want.Object, "webhooks")
		for _, w := range whs {
			svc := w.(map[string]any)["clientConfig"].(map[string]any)["service"].(map[string]any)
			svc["name"], svc["namespace"] = "cnpg-"+svc["name"].(string), "cnpg-system"
		}
		found := false
		for _, o := range objs {
			if o.GetKind() == want.GetKind() && o.GetName() == "cnpg-"+want.GetName() {
				found = true
				got, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
				if !reflect.DeepEqual(got, whs) {
					t.Errorf("%s %s: the webhooks differ from the module's config/webhook", o.GetKind(), o.GetName())
				}
			}
		}
		if !found {
			t.Errorf("infra/cnpg has no %s cnpg-%s", want.GetKind(), want.GetName())
		}
	}

	// RBAC: the same (group, resource, verb)s as upstream's ClusterRole.
	raw, err = os.ReadFile(filepath.Join(mod, "config/rbac/role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role struct {
		Rules []struct{ APIGroups, Resources, Verbs []string }
	}
	if err := yaml.Unmarshal(raw, &role); err != nil {
		t.Fatal(err)
	}
	triples := func(rules []struct{ APIGroups, Resources, Verbs []string }) []string {
		var out []string
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out = append(out, g+"/"+res+":"+v)
					}
				}
			}
		}
		sort.Strings(out)
		return slices.Compact(out)
	}
	var ourRules []struct{ APIGroups, Resources, Verbs []string }
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" || !strings.HasPrefix(o.GetName(), "cnpg-manager") {
			continue
		}
		data, _ := yaml.Marshal(o.Object)
		var r struct {
			Rules []struct{ APIGroups, Resources, Verbs []string }
		}
		if err := yaml.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		ourRules = append(ourRules, r.Rules...)
	}
	want, got := triples(role.Rules), triples(ourRules)
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("the operator may not %s, which upstream's ClusterRole grants", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("the operator may %s, which upstream's ClusterRole does not grant", g)
		}
	}

	image := "ghcr.io/cloudnative-pg/cloudnative-pg:" + strings.TrimPrefix(version, "v")
	checkOperatorImage(t, objects(t, render(t, "bex")), image)
}

// checkOperatorImage: the operator's Deployment runs image and names it as the
// image of the Postgres pods' init container (OPERATOR_IMAGE_NAME).
func checkOperatorImage(t *testing.T, objs []*unstructured.Unstructured, image string) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != "cnpg-controller-manager" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		c := cs[0].(map[string]any)
		env := map[string]any{}
		for _, e := range c["env"].([]any) {
			env[e.(map[string]any)["name"].(string)] = e.(map[string]any)["value"]
		}
		if c["image"] != image || env["OPERATOR_IMAGE_NAME"] != image {
			t.Errorf("the operator runs %v with OPERATOR_IMAGE_NAME %v, want %s for both", c["image"], env["OPERATOR_IMAGE_NAME"], image)
		}
		return
	}
	t.Error("no Deployment cnpg-controller-manager")
}

// TestCNPGImageFromInstallScript: hack/install-bex.sh's CNPG_IMAGE replaces the
// operator's image and its OPERATOR_IMAGE_NAME alike (hack/cluster-local.sh
// gives the one built from the module).
func TestCNPGImageFromInstallScript(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectlBin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	const image = "registry.example.com:5000/team/cloudnative-pg:1.27.1-bex"
	cmd := exec.Command("bash", filepath.Join(root, "hack/install-bex.sh"), "--print")
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectlBin, "CNPG_IMAGE="+image)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/install-bex.sh --print: %v\n%s", err, stderr.String())
	}
	checkOperatorImage(t, objects(t, out), image)
}

// TestRBACCNPGOperatorConfined applies infra/bex and asks the API server what
// CloudNativePG's operator may do: its Clusters' objects in the apps'
// namespace and its own, its two webhook configurations and the nodes; nothing
// in bex-system (the edge's keys, the registry's credentials), kube-system, or
// any other namespace.
func TestRBACCNPGOperatorConfined(t *testing.T) {
	applyBex(t)
	const user = "system:serviceaccount:cnpg-system:cnpg-manager"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:cnpg-system", "system:authenticated"}
	can := func(verb, group, resource, sub, ns, name string) bool {
		t.Helper()
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub, Name: name},
		}}
		if err := controlPlane(t).Client.Create(context.Background(), review); err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return review.Status.Allowed
	}
	for _, c := range []struct {
		verb, group, resource, sub, ns, name string
		want                                 bool
	}{
		// What a Cluster needs, in the apps' namespace.
		{"create", "", "pods", "", "default", "", true},
		{"create", "", "pods", "exec", "default", "", true},
		{"create", "", "persistentvolumeclaims", "", "default", "", true},
		{"get", "", "secrets", "", "default", "", true},
		{"create", "", "secrets", "", "default", "", true},
		{"watch", "postgresql.cnpg.io", "clusters", "", "default", "", true},
		{"patch", "postgresql.cnpg.io", "clusters", "status", "default", "", true},
		{"create", "rbac.authorization.k8s.io", "roles", "", "default", "", true},
		{"create", "policy", "poddisruptionbudgets", "", "default", "", true},
		// Its own namespace: leader election, the webhooks' certificates.
		{"create", "coordination.k8s.io", "leases", "", "cnpg-system", "", true},
		{"create", "", "secrets", "", "cnpg-system", "", true},
		{"list", "apps", "deployments", "", "cnpg-system", "", true},
		// Cluster-scoped.
		{"watch", "", "nodes", "", "", "", true},
		{"list", "postgresql.cnpg.io", "clusterimagecatalogs", "", "", "", true},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", "cnpg-validating-webhook-configuration", true},
		{"patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", "cnpg-mutating-webhook-configuration", true},
		// Not beyond.
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", "other", false},
		{"get", "", "secrets", "", "bex-system", "", false},
		{"list", "", "secrets", "", "bex-gitserver", "", false},
		{"get", "", "secrets", "", "kube-system", "", false},
		{"list", "", "secrets", "", "", "", false},
		{"create", "", "pods", "", "bex-system", "", false},
		{"create", "", "pods", "", "kube-system", "", false},
		{"list", "", "pods", "", "", "", false},
		{"create", "rbac.authorization.k8s.io", "roles", "", "bex-system", "", false},
		{"create", "rbac.authorization.k8s.io", "clusterroles", "", "", "", false},
		{"get", "app.bex.co", "apps", "", "default", "", false},
		{"delete", "", "nodes", "", "", "", false},
	} {
		if got := can(c.verb, c.group, c.resource, c.sub, c.ns, c.name); got != c.want {
			where := "cluster-wide"
			if c.ns != "" {
				where = "in " + c.ns
			}
			t.Errorf("cnpg-manager: %s %s/%s %s %s %s: allowed %v, want %v", c.verb, c.group, c.resource, c.sub, where, c.name, got, c.want)
		}
	}
}
