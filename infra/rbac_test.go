package infra

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"bex.co/bex/internal/testenv"
)

// A grant is what a component's code needs: verbs on group/resource[/subresource]
// in a namespace ("*": every namespace and the cluster scope), of one object when
// name is set.
type grant struct {
	verbs    []string
	resource string
	ns       string
	name     string
}

// needs lists, per ServiceAccount of infra/bex, what its component calls (the
// comments in infra/bex/rbac-*.yaml say where in the code). The test proves both
// halves: each of these is allowed, and every other request of the grid below is
// denied.
var needs = map[string][]grant{
	"bex-deployer": {
		{[]string{"get", "list", "watch", "update", "patch"}, "app.bex.co/apps", "default", ""},
		{[]string{"get", "update", "patch"}, "app.bex.co/apps/status", "default", ""},
		{[]string{"update"}, "app.bex.co/apps/finalizers", "default", ""},
		{[]string{"get", "list", "watch", "delete"}, "app.bex.co/releases", "default", ""},
		{[]string{"get", "list", "watch", "create", "patch", "delete", "deletecollection"}, "apps/deployments", "default", ""},
		// A PodDisruptionBudget per process type of two instances or more
		// (deployer/runtime/kube disruption.go).
		{[]string{"get", "list", "watch", "create", "patch", "delete", "deletecollection"}, "policy/poddisruptionbudgets", "default", ""},
		{[]string{"get", "list", "watch", "create", "patch", "delete"}, "/services", "default", ""},
		{[]string{"get", "list", "watch"}, "/pods", "default", ""},
		// Cron jobs (deployer/runtime/kube/cron.go): CronJobs applied and deleted,
		// their Jobs listed, one created per cron:run.
		{[]string{"get", "list", "watch", "create", "patch", "delete", "deletecollection"}, "batch/cronjobs", "default", ""},
		{[]string{"get", "list", "watch", "create"}, "batch/jobs", "default", ""},
		// The apps' volumes (deployer/runtime/kube volumes.go).
		{[]string{"get", "list", "watch", "create", "patch", "delete"}, "/persistentvolumeclaims", "default", ""},
		{[]string{"create", "patch"}, "events.k8s.io/events", "default", ""},
		// Managed databases (deployer/databases/cluster): the Databases, their
		// credentials Secret created once (never read), a CloudNativePG Cluster
		// or a StatefulSet, and a NetworkPolicy each.
		{[]string{"get", "list", "watch"}, "app.bex.co/databases", "default", ""},
		{[]string{"get", "update", "patch"}, "app.bex.co/databases/status", "default", ""},
		{[]string{"update"}, "app.bex.co/databases/finalizers", "default", ""},
		{[]string{"create"}, "/secrets", "default", ""},
		{[]string{"get", "list", "watch", "create", "patch"}, "postgresql.cnpg.io/clusters", "default", ""},
		{[]string{"get", "list", "watch", "create", "patch"}, "apps/statefulsets", "default", ""},
		{[]string{"create", "patch"}, "networking.k8s.io/networkpolicies", "default", ""},
		{[]string{"create"}, "coordination.k8s.io/leases", "bex-system", ""},
		{[]string{"get", "update"}, "coordination.k8s.io/leases", "bex-system", "bex-deployer.app.bex.co"},
		{[]string{"create", "patch"}, "/events", "bex-system", ""},
		// --metrics-secure (cmd/bex/deployer.go metricsOptions): each scraper's
		// token reviewed, and its right to GET /metrics asked.
		{[]string{"create"}, "authentication.k8s.io/tokenreviews", "*", ""},
		{[]string{"create"}, "authorization.k8s.io/subjectaccessreviews", "*", ""},
	},
	"bex-gitserver": {
		{[]string{"get", "list", "watch", "create", "update", "patch", "delete"}, "app.bex.co/users", "*", ""},
		{[]string{"get", "list", "watch", "create", "update", "patch", "delete"}, "app.bex.co/apps", "default", ""},
		{[]string{"get", "list", "watch", "create", "patch", "delete"}, "app.bex.co/releases", "default", ""},
		// postgres:* and redis:* (gitserver/backend databases.go); users:remove
		// updates their members.
		{[]string{"get", "list", "watch", "create", "update", "delete"}, "app.bex.co/databases", "default", ""},
		// gitserver/hooksecrets and gitserver/tokens, --secrets-namespace=bex-gitserver.
		{[]string{"get", "list", "create", "update", "delete"}, "/secrets", "bex-gitserver", ""},
		// `logs APP [-f]` on a cluster: the app's pods by label, their logs through
		// the API server (deployer/runtime/kube ReadLogs).
		{[]string{"get", "list", "create", "patch", "delete"}, "/pods", "default", ""},
		{[]string{"get"}, "/pods/log", "default", ""},
		// One-off pods (deployer/runtime/kube OneOffs): applied, polled, attached, deleted.
		{[]string{"get", "create"}, "/pods/attach", "default", ""},
		// volumes:backup and volumes:restore (deployer/runtime/kube VolumeData):
		// the claim read, then a helper pod as a one-off.
		{[]string{"get"}, "/persistentvolumeclaims", "default", ""},
	},
	"bex-edge": {
		{[]string{"get", "list", "watch"}, "app.bex.co/apps", "default", ""},
		{[]string{"get", "list", "watch"}, "discovery.k8s.io/endpointslices", "default", ""},
		{[]string{"get", "list", "create", "update", "delete"}, "/secrets", "bex-system", ""},
		{[]string{"get", "create", "update", "delete"}, "coordination.k8s.io/leases", "bex-system", ""},
	},
	// buildkitd and the registry run with the namespace's default ServiceAccount
	// and no token: it may do nothing.
	"default": nil,
}

// The grid of requests checked for every ServiceAccount.
var (
	gridVerbs     = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	gridResources = []string{
		"app.bex.co/apps", "app.bex.co/apps/status", "app.bex.co/apps/finalizers", "app.bex.co/releases", "app.bex.co/users",
		"app.bex.co/databases", "app.bex.co/databases/status", "app.bex.co/databases/finalizers",
		"postgresql.cnpg.io/clusters", "apps/statefulsets", "networking.k8s.io/networkpolicies",
		"/secrets", "/configmaps", "/persistentvolumeclaims", "/pods", "/pods/log", "/pods/exec", "/pods/attach", "/services", "/serviceaccounts/token", "/events", "/namespaces",
		"events.k8s.io/events", "apps/deployments", "apps/daemonsets", "policy/poddisruptionbudgets", "batch/cronjobs", "batch/jobs", "discovery.k8s.io/endpointslices", "coordination.k8s.io/leases",
		"rbac.authorization.k8s.io/roles", "rbac.authorization.k8s.io/rolebindings", "rbac.authorization.k8s.io/clusterrolebindings",
		"apiextensions.k8s.io/customresourcedefinitions",
		"authentication.k8s.io/tokenreviews", "authorization.k8s.io/subjectaccessreviews",
	}
	gridNamespaces = []string{"default", "bex-system", "bex-gitserver", "kube-system", ""}
)

func (g grant) allows(verb, resource, ns, name string) bool {
	return slices.Contains(g.verbs, verb) && g.resource == resource && (g.ns == "*" || g.ns == ns) && (g.name == "" || g.name == name)
}

func allowed(sa, verb, resource, ns, name string) bool {
	for _, g := range needs[sa] {
		if g.allows(verb, resource, ns, name) {
			return true
		}
	}
	return false
}

// applyBex applies infra/bex to the shared API server for real (no controller
// runs there: the workloads stay objects).
func applyBex(t *testing.T) {
	t.Helper()
	cp := controlPlane(t)
	if _, err := kubectl(t, render(t, "bex"), "--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "--force-conflicts",
		"--field-manager=bex-infra-test", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// can asks the API server whether ServiceAccount bex-system/sa may do it.
func can(t *testing.T, sa, verb, resource, ns, name string) bool {
	t.Helper()
	group, rest, _ := strings.Cut(resource, "/")
	res, sub, _ := strings.Cut(rest, "/")
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:bex-system:" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:bex-system", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: res, Subresource: sub, Name: name,
		},
	}}
	if err := controlPlane(t).Client.Create(context.Background(), review); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return review.Status.Allowed
}

// canGetURL asks the API server whether user (in groups) may GET the
// non-resource URL path.
func canGetURL(t *testing.T, user string, groups []string, path string) bool {
	t.Helper()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}
	if err := controlPlane(t).Client.Create(context.Background(), review); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return review.Status.Allowed
}

func describe(sa, verb, resource, ns, name string) string {
	where := "cluster-wide"
	if ns != "" {
		where = "in " + ns
	}
	if name != "" {
		where += " (" + name + ")"
	}
	return fmt.Sprintf("%s: %s %s %s", sa, verb, resource, where)
}

// TestRBACLeastPrivilege applies infra/bex and checks with SubjectAccessReviews
// that each component may do what its code does, and nothing else on a grid of
// verbs × resources × namespaces.
func TestRBACLeastPrivilege(t *testing.T) {
	applyBex(t)

	// The API server authorizes with RBAC: an unknown ServiceAccount may not even
	// read Apps (otherwise every check below would pass vacuously).
	if can(t, "nobody", "get", "app.bex.co/apps", "default", "") {
		t.Fatal("an unknown ServiceAccount may read Apps: the API server does not authorize with RBAC")
	}

	// What each one needs, including the named lease.
	for sa, grants := range needs {
		for _, g := range grants {
			ns := g.ns
			if ns == "*" {
				ns = ""
			}
			for _, v := range g.verbs {
				if !can(t, sa, v, g.resource, ns, g.name) {
					t.Errorf("denied, but the code needs it: %s", describe(sa, v, g.resource, ns, g.name))
				}
			}
		}
	}
	// The deployer's leader election Lease is its own: no other Lease.
	if can(t, "bex-deployer", "update", "coordination.k8s.io/leases", "bex-system", "bex-edge-lock") {
		t.Error("the deployer may update Leases other than its leader election's")
	}

	// Nothing beyond: the whole grid, in parallel.
	type req struct{ sa, verb, resource, ns string }
	var reqs []req
	for sa := range needs {
		for _, v := range gridVerbs {
			for _, r := range gridResources {
				for _, ns := range gridNamespaces {
					reqs = append(reqs, req{sa, v, r, ns})
				}
			}
		}
	}
	var mu sync.Mutex
	var wrong []string
	checked := 0
	var wg sync.WaitGroup
	work := make(chan req)
	for range 8 {
		wg.Go(func() {
			for q := range work {
				got, want := can(t, q.sa, q.verb, q.resource, q.ns, ""), allowed(q.sa, q.verb, q.resource, q.ns, "")
				mu.Lock()
				checked++
				if got != want {
					verdict := "allowed beyond what the code needs"
					if !got {
						verdict = "denied although the code needs it"
					}
					wrong = append(wrong, verdict+": "+describe(q.sa, q.verb, q.resource, q.ns, ""))
				}
				mu.Unlock()
			}
		})
	}
	for _, q := range reqs {
		work <- q
	}
	close(work)
	wg.Wait()
	slices.Sort(wrong)
	for _, w := range wrong {
		t.Error(w)
	}
	t.Logf("%d SubjectAccessReviews on the grid, %d differing from the code's needs", checked, len(wrong))

	// The examples the issue names, spelled out.
	for _, c := range []struct {
		sa, verb, resource, ns string
		want                   bool
	}{
		{"bex-edge", "update", "app.bex.co/apps", "default", false},
		{"bex-edge", "create", "app.bex.co/apps", "default", false},
		{"bex-edge", "get", "/secrets", "default", false},
		{"bex-edge", "get", "/secrets", "bex-system", true},
		{"bex-gitserver", "get", "/secrets", "default", false},
		{"bex-gitserver", "list", "/secrets", "default", false},
		{"bex-gitserver", "delete", "/secrets", "default", false},
		{"bex-gitserver", "get", "/secrets", "bex-gitserver", true},
		{"bex-gitserver", "create", "/secrets", "bex-gitserver", true},
		{"bex-gitserver", "watch", "/secrets", "bex-gitserver", false},
		// The edge's certificate keys and the gitserver's secrets do not cross.
		{"bex-gitserver", "get", "/secrets", "bex-system", false},
		{"bex-edge", "get", "/secrets", "bex-gitserver", false},
		{"bex-gitserver", "get", "/secrets", "", false},
		{"bex-gitserver", "create", "app.bex.co/apps", "default", true},
		{"bex-deployer", "get", "/secrets", "default", false},
		{"bex-deployer", "patch", "apps/deployments", "default", true},
		{"bex-deployer", "create", "app.bex.co/apps", "default", false},
	} {
		if got := can(t, c.sa, c.verb, c.resource, c.ns, ""); got != c.want {
			t.Errorf("%s: allowed %v, want %v", describe(c.sa, c.verb, c.resource, c.ns, ""), got, c.want)
		}
	}
}

// TestMetricsReaderRole: the ClusterRole bex-metrics-reader, which an operator
// binds to their Prometheus (docs/cluster.md), lets its subject GET /metrics and
// nothing else; without that binding no one of bex's ServiceAccounts, and no
// other authenticated ServiceAccount, may (the deployer's --metrics-secure asks
// exactly this SubjectAccessReview).
func TestMetricsReaderRole(t *testing.T) {
	applyBex(t)
	saGroups := func(ns string) []string {
		return []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	const scraper = "system:serviceaccount:bex-metrics-test:prometheus"
	for sa := range needs {
		if canGetURL(t, "system:serviceaccount:bex-system:"+sa, saGroups("bex-system"), "/metrics") {
			t.Errorf("%s may GET /metrics without being bound to bex-metrics-reader", sa)
		}
	}
	if canGetURL(t, scraper, saGroups("bex-metrics-test"), "/metrics") {
		t.Fatal("an unbound ServiceAccount may GET /metrics: the check below would pass vacuously")
	}

	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bex-metrics-test-" + strings.ToLower(t.Name())},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "bex-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "bex-metrics-test", Name: "prometheus"}},
	}
	c := controlPlane(t).Client
	if err := c.Create(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), binding) })

	// The API server's authorizer sees the new binding through its informers.
	testenv.Eventually(t, 30*time.Second, "bound to bex-metrics-reader, a ServiceAccount may GET /metrics", func() error {
		if !canGetURL(t, scraper, saGroups("bex-metrics-test"), "/metrics") {
			return fmt.Errorf("denied")
		}
		return nil
	})
	// Other URLs: whatever the binding adds beyond what any ServiceAccount of the
	// namespace may (discovery is open to every authenticated caller).
	const unbound = "system:serviceaccount:bex-metrics-test:other"
	for _, path := range []string{"/api", "/healthz/etcd", "/debug/pprof/", "/logs/", "/metrics/slis", "/readyz"} {
		if canGetURL(t, scraper, saGroups("bex-metrics-test"), path) && !canGetURL(t, unbound, saGroups("bex-metrics-test"), path) {
			t.Errorf("bex-metrics-reader grants GET %s", path)
		}
	}
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: scraper, Groups: saGroups("bex-metrics-test"),
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "post"},
	}}
	if err := c.Create(context.Background(), review); err != nil {
		t.Fatal(err)
	}
	if review.Status.Allowed {
		t.Error("bex-metrics-reader grants more verbs on /metrics than get")
	}
}
