package kube_test

import (
	"maps"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
)

func (f *fixture) budget(name string) *policyv1.PodDisruptionBudget {
	f.t.Helper()
	pdb := &policyv1.PodDisruptionBudget{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, pdb); err != nil {
		f.t.Fatalf("get poddisruptionbudget %s: %v", name, err)
	}
	return pdb
}

// checkBudget fails unless pdb is the app's budget of process: one instance
// evicted at a time, the Deployment's pods, owned by the App.
func (f *fixture) checkBudget(pdb *policyv1.PodDisruptionBudget, process string) {
	f.t.Helper()
	want := map[string]string{kube.LabelApp: "hello", kube.LabelProcess: process}
	if !maps.Equal(pdb.Labels, want) {
		f.t.Errorf("%s: labels %v", pdb.Name, pdb.Labels)
	}
	s := pdb.Spec
	if s.MaxUnavailable == nil || *s.MaxUnavailable != intstr.FromInt32(1) || s.MinAvailable != nil {
		f.t.Errorf("%s: maxUnavailable %v, minAvailable %v", pdb.Name, s.MaxUnavailable, s.MinAvailable)
	}
	if s.Selector == nil || len(s.Selector.MatchExpressions) != 0 || !maps.Equal(s.Selector.MatchLabels, want) {
		f.t.Errorf("%s: selector %+v", pdb.Name, s.Selector)
	}
	// The same pods as the Deployment's.
	if dep := f.deployment(pdb.Name); !maps.Equal(dep.Spec.Selector.MatchLabels, s.Selector.MatchLabels) {
		f.t.Errorf("%s: selector %v, the Deployment's %v", pdb.Name, s.Selector.MatchLabels, dep.Spec.Selector.MatchLabels)
	}
	if s.UnhealthyPodEvictionPolicy == nil || *s.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
		f.t.Errorf("%s: unhealthyPodEvictionPolicy %v", pdb.Name, s.UnhealthyPodEvictionPolicy)
	}
	refs := pdb.OwnerReferences
	if len(refs) != 1 || refs[0].Kind != "App" || refs[0].APIVersion != appv1.GroupVersion.String() || refs[0].Name != "hello" ||
		refs[0].UID != f.app.UID || refs[0].Controller == nil || !*refs[0].Controller {
		f.t.Errorf("%s: owner references %+v", pdb.Name, refs)
	}
}

// TestDisruptionBudgetPerProcessOfTwoOrMore: a process type of two instances or
// more gets a PodDisruptionBudget of its own (a node's drain evicts one
// instance at a time); one of fewer, suspended, or gone has none; Delete
// deletes them and no other app's.
func TestDisruptionBudgetPerProcessOfTwoOrMore(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 1}})
	f.sync(d)
	f.checkBudget(f.budget("hello-web"), "web")
	if !f.gone(&policyv1.PodDisruptionBudget{}, "hello-worker") {
		t.Fatal("a budget for the worker's one instance")
	}
	// An unchanged Sync does not write it.
	rv := f.budget("hello-web").ResourceVersion
	f.sync(d)
	if got := f.budget("hello-web").ResourceVersion; got != rv {
		t.Fatalf("an unchanged Sync wrote the budget: resourceVersion %s → %s", rv, got)
	}

	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 3}}))
	f.checkBudget(f.budget("hello-web"), "web")
	f.checkBudget(f.budget("hello-worker"), "worker")

	// Scaled to one: no budget; the worker's stays.
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 3}}))
	if !f.gone(&policyv1.PodDisruptionBudget{}, "hello-web") {
		t.Fatal("web's budget left after scaling to 1")
	}
	f.checkBudget(f.budget("hello-worker"), "worker")

	// The worker process type removed: its budget goes with its Deployment.
	f.sync(f.desired(2, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}}))
	if !f.gone(&policyv1.PodDisruptionBudget{}, "hello-worker") {
		t.Fatal("the removed worker's budget is still there")
	}
	f.checkBudget(f.budget("hello-web"), "web")

	// Suspended: every process at 0, no budget.
	d = f.desired(2, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}})
	d.Suspended = true
	f.sync(d)
	if !f.gone(&policyv1.PodDisruptionBudget{}, "hello-web") {
		t.Fatal("a suspended app's budget")
	}

	// Delete: the app's budgets go, another app's stay.
	f.sync(f.desired(3, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 3}}))
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.ns}}
	if err := f.c.Create(f.ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.Sync(f.ctx, runtime.Desired{App: other, Release: 1, Image: imageA, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Delete(f.ctx, client.ObjectKeyFromObject(f.app)); err != nil {
		t.Fatal(err)
	}
	var left policyv1.PodDisruptionBudgetList
	if err := f.c.List(f.ctx, &left, client.InNamespace(f.ns), client.MatchingLabels{kube.LabelApp: "hello"}); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Fatalf("Delete left %d budgets", len(left.Items))
	}
	if f.gone(&policyv1.PodDisruptionBudget{}, "other-web") {
		t.Fatal("Delete removed another app's budget")
	}
}

// TestADisruptionBudgetNotTheAppsIsLeftAlone: a budget of the process type's
// name made by hand (without the app's label) is neither taken over when the
// process type runs two instances nor deleted when it runs one.
func TestADisruptionBudgetNotTheAppsIsLeftAlone(t *testing.T) {
	f := setup(t)
	minAvailable := intstr.FromInt32(1)
	mine := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-web", Namespace: f.ns, Labels: map[string]string{"team": "ops"}},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvailable,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{kube.LabelApp: "hello"}},
		},
	}
	if err := f.c.Create(f.ctx, mine); err != nil {
		t.Fatal(err)
	}
	untouched := func(when string) {
		t.Helper()
		got := f.budget("hello-web")
		if got.UID != mine.UID || got.ResourceVersion != mine.ResourceVersion {
			t.Fatalf("%s: the budget made by hand was replaced or written (resourceVersion %s → %s): %+v", when, mine.ResourceVersion, got.ResourceVersion, got)
		}
	}

	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}}))
	untouched("two instances")
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}}))
	untouched("scaled to one")
	f.sync(f.desired(2, imageA, map[string]appv1.ProcessSpec{"worker": {Replicas: 1}}))
	untouched("web removed")
	if err := f.rt.Delete(f.ctx, client.ObjectKeyFromObject(f.app)); err != nil {
		t.Fatal(err)
	}
	untouched("app deleted")
}

// TestNoDisruptionBudgetForAProcessWithAVolume: the instances of a process type
// that mounts a (ReadWriteOnce) volume share its node, so a replacement could
// only start on the node being drained: a budget would hold the drain forever.
func TestNoDisruptionBudgetForAProcessWithAVolume(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 2}})
	d.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("1Gi"), Processes: []string{"worker"}}}
	f.sync(d)
	f.checkBudget(f.budget("hello-web"), "web")
	if !f.gone(&policyv1.PodDisruptionBudget{}, "hello-worker") {
		t.Fatal("a budget for the worker, whose instances share a volume")
	}
	// The volume taken out: the worker's instances may spread, and get a budget.
	d.Volumes = nil
	f.sync(d)
	f.checkBudget(f.budget("hello-worker"), "worker")
}
