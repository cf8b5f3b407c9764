package infra

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"bex.co/bex/internal/clusterapi"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// An overlay is a directory under infra/ that renders to manifests.
type overlay struct {
	dir string // relative to infra/
	// vars are the clusterctl template variables to substitute; nil for a
	// directory that is no template.
	vars map[string]string
	// kinds are the kinds it must render, at least once each.
	kinds []string
}

var common = map[string]string{
	"CLUSTER_NAME":                "bex-test",
	"KUBERNETES_VERSION":          "v1.35.0",
	"CONTROL_PLANE_MACHINE_COUNT": "1",
	"WORKER_MACHINE_COUNT":        "2",
	"REGISTRY_NODE_PASSWORD":      "0123456789abcdef0123456789abcdef",
}

var hetzner = merge(common, map[string]string{
	"HCLOUD_REGION":                     "fsn1",
	"SSH_KEY_NAME":                      "bex",
	"HCLOUD_CONTROL_PLANE_MACHINE_TYPE": "cpx31",
	"HCLOUD_WORKER_MACHINE_TYPE":        "cpx31",
})

var overlays = []overlay{
	{dir: "clusterapi/overlays/local-capd", vars: merge(common, map[string]string{"CAPD_NODE_IMAGE": "bex.local/capd/node:v1.35.0"}), kinds: []string{
		"Cluster", "KubeadmControlPlane", "MachineDeployment", "KubeadmConfigTemplate", "MachineHealthCheck", "DevCluster", "DevMachineTemplate"}},
	{dir: "clusterapi/overlays/hetzner-caph", vars: hetzner, kinds: []string{
		"Cluster", "KubeadmControlPlane", "MachineDeployment", "KubeadmConfigTemplate", "MachineHealthCheck", "HetznerCluster", "HCloudMachineTemplate"}},
	{dir: "clusterapi/overlays/hetzner-caph-baremetal", vars: merge(hetzner, map[string]string{"HETZNER_ROBOT_SERVER_ID": "1234567"}), kinds: []string{
		"HetznerCluster", "HCloudMachineTemplate", "HetznerBareMetalHost", "HetznerBareMetalMachineTemplate", "MachineDeployment", "MachineHealthCheck"}},
	{dir: "bex", kinds: []string{
		"Namespace", "CustomResourceDefinition", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
		"Deployment", "StatefulSet", "DaemonSet", "Service", "PersistentVolumeClaim", "NetworkPolicy", "CronJob",
		"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}},
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// infraDir is infra/ in the repository.
func infraDir(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "infra")
}

// kubectl runs bin/kubectl with args and stdin, and returns its output; an error
// carries stderr.
func kubectl(t testing.TB, stdin []byte, args ...string) ([]byte, error) {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// render is `kubectl kustomize infra/<dir>`.
func render(t testing.TB, dir string) []byte {
	t.Helper()
	out, err := kubectl(t, nil, "kustomize", filepath.Join(infraDir(t), dir))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// templateVar is a variable reference as clusterctl's envsubst reads it: ${NAME},
// ${NAME:=default} or ${NAME:-default}. Anything else between ${ and } is refused
// by substitute, so that no shell expansion slips into a template by accident.
var (
	templateRef = regexp.MustCompile(`\$\{([^}]*)\}`)
	templateVar = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)(?::[=-](.*))?$`)
)

// variables lists the template variables of text: name → has a default.
func variables(text []byte) (map[string]bool, error) {
	vars := map[string]bool{}
	for _, m := range templateRef.FindAllSubmatch(text, -1) {
		v := templateVar.FindSubmatch(m[1])
		if v == nil {
			return nil, fmt.Errorf("%s is no template variable that clusterctl substitutes plainly", m[0])
		}
		vars[string(v[1])] = vars[string(v[1])] || len(v[2]) > 0 || bytes.Contains(m[1], []byte(":"))
	}
	return vars, nil
}

// substitute replaces the template variables of text as `clusterctl generate
// cluster` does: the value given, else the default; a variable with neither is an
// error.
func substitute(text []byte, vars map[string]string) ([]byte, error) {
	var missing []string
	out := templateRef.ReplaceAllFunc(text, func(ref []byte) []byte {
		v := templateVar.FindSubmatch(ref[2 : len(ref)-1])
		if v == nil {
			missing = append(missing, string(ref))
			return ref
		}
		if val, ok := vars[string(v[1])]; ok {
			return []byte(val)
		}
		if bytes.Contains(ref, []byte(":")) {
			return v[2]
		}
		missing = append(missing, string(v[1]))
		return ref
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("template variables without a value: %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// objects decodes a multi-document YAML stream.
func objects(t testing.TB, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decode rendered manifests: %v", err)
		}
		if m == nil {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// encode writes objects back as one YAML stream.
func encode(t testing.TB, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, o := range objs {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(data)
	}
	return buf.Bytes()
}

// manifests renders o and substitutes its variables.
func manifests(t testing.TB, o overlay) []byte {
	t.Helper()
	out := render(t, o.dir)
	if o.vars == nil {
		return out
	}
	out, err := substitute(out, o.vars)
	if err != nil {
		t.Fatalf("%s: %v", o.dir, err)
	}
	return out
}

func TestRender(t *testing.T) {
	for _, o := range overlays {
		t.Run(o.dir, func(t *testing.T) {
			raw := render(t, o.dir)
			if o.vars != nil {
				// Every variable the template uses is one that the overlay's
				// documentation names (given here) or has a default.
				vars, err := variables(raw)
				if err != nil {
					t.Fatal(err)
				}
				for name, hasDefault := range vars {
					if _, given := o.vars[name]; !given && !hasDefault {
						t.Errorf("template variable %s has no default and is not among the documented ones", name)
					}
				}
				for name := range o.vars {
					if _, used := vars[name]; !used {
						t.Errorf("variable %s is given but the template does not use it", name)
					}
				}
			}
			got := map[string]int{}
			for _, obj := range objects(t, manifests(t, o)) {
				got[obj.GetKind()]++
				if obj.GetKind() == "ConfigMap" && obj.GetName() == "node-setup" {
					t.Errorf("the node-setup ConfigMap is a vehicle for kustomize and must not be rendered")
				}
				// Every machine's drain has a bound: a tenant's disruption
				// budget that never allows an eviction must not hold an
				// upgrade or a remediation forever.
				var drain []string
				switch obj.GetKind() {
				case "MachineDeployment":
					drain = []string{"spec", "template", "spec", "deletion", "nodeDrainTimeoutSeconds"}
				case "KubeadmControlPlane":
					drain = []string{"spec", "machineTemplate", "spec", "deletion", "nodeDrainTimeoutSeconds"}
				}
				if drain != nil {
					v, _, _ := unstructured.NestedFieldNoCopy(obj.Object, drain...)
					if secs, _ := v.(float64); secs <= 0 {
						t.Errorf("%s %s has no %s: a drain would wait for the apps' disruption budgets forever",
							obj.GetKind(), obj.GetName(), strings.Join(drain, "."))
					}
				}
			}
			for _, k := range o.kinds {
				if got[k] == 0 {
					t.Errorf("renders no %s (got %v)", k, got)
				}
			}
		})
	}
}

// TestNodeSetupScriptIsEmbedded: the Hetzner machines get the node setup script
// verbatim, in the control plane's and in every worker pool's cloud-init files.
func TestNodeSetupScriptIsEmbedded(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(infraDir(t), "clusterapi/overlays/hetzner-caph/node-setup.sh"))
	if err != nil {
		t.Fatal(err)
	}
	o := overlays[2] // hetzner-caph-baremetal: two worker pools
	found := 0
	for _, obj := range objects(t, manifests(t, o)) {
		var files []any
		switch obj.GetKind() {
		case "KubeadmControlPlane":
			files, _, _ = unstructured.NestedSlice(obj.Object, "spec", "kubeadmConfigSpec", "files")
		case "KubeadmConfigTemplate":
			files, _, _ = unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "files")
		default:
			continue
		}
		ok := false
		for _, f := range files {
			f := f.(map[string]any)
			if f["path"] == "/usr/local/sbin/bex-node-setup.sh" {
				ok = f["content"] == string(script)
			}
		}
		if !ok {
			t.Errorf("%s %s: no /usr/local/sbin/bex-node-setup.sh with node-setup.sh's content", obj.GetKind(), obj.GetName())
		}
		found++
	}
	if found != 3 {
		t.Errorf("checked %d objects, want the control plane and two worker templates", found)
	}
}

// TestCRDKustomizationListsEveryCRD: infra/bex installs deployer/api/crds through its
// kustomization.yml, which must name every CRD that `make generate` writes. (It
// installs CloudNativePG's too, from infra/cnpg: cnpg_test.go checks those.)
func TestCRDKustomizationListsEveryCRD(t *testing.T) {
	root, _ := testenv.RepoRoot()
	files, err := filepath.Glob(filepath.Join(root, "deployer/api/crds/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in deployer/api/crds (%v)", err)
	}
	var want []string
	for _, f := range files {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		data, _ := os.ReadFile(f)
		if err := yaml.Unmarshal(data, crd); err != nil {
			t.Fatal(err)
		}
		want = append(want, crd.Name)
	}
	var got []string
	for _, obj := range objects(t, render(t, "bex")) {
		if obj.GetKind() == "CustomResourceDefinition" && strings.HasSuffix(obj.GetName(), ".app.bex.co") {
			got = append(got, obj.GetName())
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("infra/bex renders CRDs %v, deployer/api/crds has %v: add the new file to deployer/api/crds/kustomization.yml", got, want)
	}
}

// --- the API server ---------------------------------------------------------------

var clusterAPI struct {
	once sync.Once
	cp   *testenv.ControlPlane
	n    int
	err  error
}

// versions reads hack/versions.env.
func versions(t testing.TB) map[string]string {
	t.Helper()
	root, _ := testenv.RepoRoot()
	f, err := os.Open(filepath.Join(root, "hack/versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out
}

// moduleDir downloads a module into the module cache and returns its directory.
func moduleDir(path, version string) (string, error) { return clusterapi.DownloadModule(path, version) }

// crdFiles lists the CRD files that the Cluster API overlays need: Cluster API
// core, kubeadm bootstrap and control plane, CAPD (from the module cache) and CAPH
// (testdata).
func crdFiles(t testing.TB) []string {
	t.Helper()
	v := versions(t)
	capi, caph := v["CLUSTER_API_VERSION"], v["CAPH_VERSION"]
	if capi == "" || caph == "" {
		t.Fatal("hack/versions.env names no CLUSTER_API_VERSION or CAPH_VERSION")
	}
	core, err := moduleDir("sigs.k8s.io/cluster-api", capi)
	if err != nil {
		t.Fatal(err)
	}
	// CAPD is the nested module sigs.k8s.io/cluster-api/test.
	capd, err := moduleDir("sigs.k8s.io/cluster-api/test", capi)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{
		filepath.Join(core, "core/config/crd/bases"),
		filepath.Join(core, "bootstrap/kubeadm/config/crd/bases"),
		filepath.Join(core, "controlplane/kubeadm/config/crd/bases"),
		filepath.Join(capd, "infrastructure/docker/config/crd/bases"),
		filepath.Join(infraDir(t), "testdata/crds", "cluster-api-provider-hetzner-"+caph),
	}
	var files []string
	for _, d := range dirs {
		fs, err := filepath.Glob(filepath.Join(d, "*.yaml"))
		if err != nil || len(fs) == 0 {
			t.Fatalf("no CRDs in %s (%v)", d, err)
		}
		files = append(files, fs...)
	}
	return files
}

// controlPlane returns the shared envtest with the Cluster API CRDs installed too.
func controlPlane(t testing.TB) *testenv.ControlPlane {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	clusterAPI.once.Do(func() {
		var crds []*apiextensionsv1.CustomResourceDefinition
		for _, f := range crdFiles(t) {
			data, err := os.ReadFile(f)
			if err != nil {
				clusterAPI.err = err
				return
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(data, crd); err != nil {
				clusterAPI.err = fmt.Errorf("%s: %w", f, err)
				return
			}
			// Several versions are served (v1beta1 and v1beta2) and Cluster API
			// converts between them with a conversion webhook of its controllers.
			// None runs here: the API server converts by rewriting apiVersion
			// alone, which is all a dry-run needs (each object is validated
			// against the schema of the version it is written in).
			crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}
			crds = append(crds, crd)
		}
		_, clusterAPI.err = envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{CRDs: crds, MaxTime: time.Minute})
		clusterAPI.cp, clusterAPI.n = cp, len(crds)
	})
	if clusterAPI.err != nil {
		t.Fatalf("install the Cluster API CRDs: %v", clusterAPI.err)
	}
	return clusterAPI.cp
}

// dryRun sends manifests to the API server as a server-side apply dry-run, in
// namespace ns for objects that name none (a clusterctl template's; infra/bex's
// name their own, and ns is then "").
func dryRun(t testing.TB, cp *testenv.ControlPlane, ns string, manifests []byte) error {
	t.Helper()
	// --force-conflicts: the question is whether the API server accepts the
	// objects, not who else manages fields of them (envtest installed bex's CRDs
	// under its own field manager).
	args := []string{"--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "--dry-run=server", "--field-manager=bex-infra-test", "--force-conflicts", "-f", "-"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	_, err := kubectl(t, manifests, args...)
	return err
}

// namespaceFor is the namespace a dry-run of o runs in.
func namespaceFor(o overlay, ns string) string {
	if o.vars == nil {
		return ""
	}
	return ns
}

// ensureNamespace creates the namespaces that infra/bex's objects live in, for
// real: a dry-run of a namespace does not let objects into it.
func ensureNamespaces(t testing.TB, cp *testenv.ControlPlane) {
	t.Helper()
	var ns []byte
	for _, n := range []string{"bex-system", "bex-gitserver", "cnpg-system"} {
		ns = append(ns, "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+n+"\n"...)
	}
	if _, err := kubectl(t, ns, "--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

func TestDryRun(t *testing.T) {
	cp := controlPlane(t)
	ensureNamespaces(t, cp)
	ns := cp.Namespace(t, "clusters")
	for _, o := range overlays {
		t.Run(o.dir, func(t *testing.T) {
			if err := dryRun(t, cp, namespaceFor(o, ns), manifests(t, o)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDryRunRejectsBrokenVariants proves that the dry-run validates: each broken
// variant of a rendered overlay is refused, with the reason the API server gives.
func TestDryRunRejectsBrokenVariants(t *testing.T) {
	cp := controlPlane(t)
	ensureNamespaces(t, cp)
	ns := cp.Namespace(t, "broken")
	cases := []struct {
		name    string
		overlay overlay
		kind    string
		break_  func(obj *unstructured.Unstructured)
		want    string
	}{
		{"unknown field in HetznerCluster", overlays[1], "HetznerCluster", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, "yes", "spec", "floatingIP")
		}, `.spec.floatingIP: field not declared in schema`},
		{"unsupported Hetzner region", overlays[1], "HetznerCluster", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedStringSlice(obj.Object, []string{"mars1"}, "spec", "controlPlaneRegions")
		}, `Unsupported value: "mars1"`},
		{"unsupported load balancer region", overlays[1], "HetznerCluster", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, "moon1", "spec", "controlPlaneLoadBalancer", "region")
		}, `Unsupported value: "moon1"`},
		{"replicas of the wrong type", overlays[0], "KubeadmControlPlane", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, "three", "spec", "replicas")
		}, `spec.replicas`},
		{"unknown field in DevCluster", overlays[0], "DevCluster", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, "kind", "spec", "backend", "docker", "provider")
		}, `field not declared in schema`},
		{"machine template of the wrong type", overlays[1], "HCloudMachineTemplate", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, int64(31), "spec", "template", "spec", "type")
		}, `spec.template.spec.type`},
		{"bare-metal server ID as text", overlays[2], "HetznerBareMetalHost", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, "one", "spec", "serverID")
		}, `spec.serverID`},
		{"unknown field in the edge DaemonSet", overlays[3], "DaemonSet", func(obj *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(obj.Object, true, "spec", "template", "spec", "hostNetworking")
		}, `.spec.template.spec.hostNetworking: field not declared in schema`},
		{"Role with a verb list of the wrong type", overlays[3], "Role", func(obj *unstructured.Unstructured) {
			rules, _, _ := unstructured.NestedSlice(obj.Object, "rules")
			rules[0].(map[string]any)["verbs"] = "get"
			_ = unstructured.SetNestedSlice(obj.Object, rules, "rules")
		}, `verbs`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := objects(t, manifests(t, tc.overlay))
			broken := 0
			for _, obj := range objs {
				if obj.GetKind() == tc.kind && broken == 0 {
					tc.break_(obj)
					broken++
				}
			}
			if broken == 0 {
				t.Fatalf("%s renders no %s", tc.overlay.dir, tc.kind)
			}
			err := dryRun(t, cp, namespaceFor(tc.overlay, ns), encode(t, objs))
			if err == nil {
				t.Fatalf("the API server accepted %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("refused, but not for the reason expected (%q):\n%v", tc.want, err)
			}
			t.Logf("refused: %s", err.Error()[strings.Index(err.Error(), "exit status"):])
		})
	}
}
