package clusterapi

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"bex.co/bex/internal/testenv"
)

func TestWithFreePortsAreDistinct(t *testing.T) {
	ms, err := WithFreePorts(Managers())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]string{}
	for _, m := range ms {
		for _, p := range []int{m.WebhookPort, m.HealthPort, m.DiagnosticsPort} {
			if other, ok := seen[p]; ok {
				t.Errorf("port %d is %s's and %s's", p, other, m.Name)
			}
			seen[p] = m.Name
		}
	}
	if len(seen) != 3*len(Managers()) {
		t.Errorf("%d ports for %d managers", len(seen), len(ms))
	}
}

// TestManifestsPointAtTheManager: every conversion webhook of a manager's CRDs and
// every webhook of its configurations reaches that manager's webhook port on
// loopback with the CA given, none a Service.
func TestManifestsPointAtTheManager(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	version, err := ReleaseVersion(filepath.Join(root, "hack/versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	release, err := DownloadRelease(version)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _, err := WebhookServingCert(t.TempDir(), "test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := WithFreePorts(Managers())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		prefix := m.WebhookURL("/")
		crds, err := release.CRDs(kubectl, m, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		converted := 0
		for _, crd := range crds {
			c := crd.Spec.Conversion
			if c == nil || c.Webhook == nil {
				continue
			}
			cc := c.Webhook.ClientConfig
			if cc.Service != nil || cc.URL == nil || !strings.HasPrefix(*cc.URL, prefix) || string(cc.CABundle) != string(caPEM) {
				t.Errorf("%s: CRD %s converts through %+v, want %s... with the CA", m.Name, crd.Name, cc, prefix)
			}
			converted++
		}
		if converted == 0 {
			t.Errorf("%s: none of its %d CRDs converts through its webhook", m.Name, len(crds))
		}
		whs, err := release.Webhooks(m, caPEM)
		if err != nil {
			t.Fatal(err)
		}
		for _, wh := range whs {
			if !strings.HasPrefix(wh.GetName(), m.Name+"-") {
				t.Errorf("%s: webhook configuration %s is not named after it", m.Name, wh.GetName())
			}
			hooks, _, _ := unstructured.NestedSlice(wh.Object, "webhooks")
			if len(hooks) == 0 {
				t.Errorf("%s: %s has no webhook", m.Name, wh.GetName())
			}
			for _, h := range hooks {
				url, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "url")
				if _, svc, _ := unstructured.NestedMap(h.(map[string]any), "clientConfig", "service"); svc || !strings.HasPrefix(url, prefix) {
					t.Errorf("%s: %s calls %q, want %s...", m.Name, wh.GetName(), url, prefix)
				}
			}
		}
	}
}
