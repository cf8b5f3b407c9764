package kube

import (
	"context"
	"fmt"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// A cluster's nodes are drained before they go (Cluster API drains a Machine's
// node before deleting it, at an upgrade or a scale-down; so does `kubectl
// drain`). A drain evicts every pod of the node at once unless a
// PodDisruptionBudget says otherwise: the instances of a process type that
// happened to share the node all stopped together, and a web app stopped
// answering until its new pods were ready elsewhere (635 of 1119 requests
// failed during a workers' rollout). So each process type that runs two
// instances or more gets a PodDisruptionBudget of maxUnavailable 1: the drain
// evicts one instance, and the next only once its replacement is ready on
// another node. With one instance there is no other to keep serving, and a
// budget would only block the drain; there is none.
//
// Unready pods may always be evicted (unhealthyPodEvictionPolicy AlwaysAllow):
// a crash-looping app is down anyway, and must not hold a node's drain, hence
// a cluster's upgrade, forever.
//
// Nor is there a budget for a process type that mounts a volume: its
// ReadWriteOnce claim pins all its instances to the node it is attached to,
// so the replacement of an evicted one could only start on the node being
// drained, and the budget would hold the drain forever.

// minReplicasForBudget is the fewest instances whose process type gets a
// PodDisruptionBudget.
const minReplicasForBudget = 2

// wantsDisruptionBudget says whether process of d gets a PodDisruptionBudget.
func wantsDisruptionBudget(d runtime.Desired, process string) bool {
	return replicasOf(d, process) >= minReplicasForBudget && len(volumesOf(d.Volumes, process)) == 0
}

// disruptionBudget is the apply configuration of the PodDisruptionBudget of
// one process type of app: at most one of its instances evicted at a time. It
// is named as the process type's Deployment, and selects the same pods.
func disruptionBudget(app *appv1.App, process string) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	return policyv1ac.PodDisruptionBudget(DeploymentName(app.Name, process), app.Namespace).
		WithLabels(map[string]string{LabelApp: app.Name, LabelProcess: process}).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(processSelector(app.Name, process))).
			WithUnhealthyPodEvictionPolicy(policyv1.AlwaysAllow))
}

// syncDisruptionBudgets applies a PodDisruptionBudget per process type of d
// that wants one, and deletes the app's others (a process type scaled below
// two, suspended, or gone). A budget of the same name that is not the app's
// (made by hand, without the app's label) is left alone, applied over or
// deleted never: it is its maker's say on those pods, and applying over it
// could make it invalid (minAvailable and maxUnavailable both set).
func (r *Runtime) syncDisruptionBudgets(ctx context.Context, d runtime.Desired) error {
	key := d.Key()
	var list policyv1.PodDisruptionBudgetList
	if err := r.c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name}); err != nil {
		return fmt.Errorf("app %s: list poddisruptionbudgets: %w", key, err)
	}
	ours := make(map[string]*policyv1.PodDisruptionBudget, len(list.Items))
	for i := range list.Items {
		ours[list.Items[i].Name] = &list.Items[i]
	}
	want := map[string]bool{}
	for _, p := range processOrder(d.Processes) {
		if !wantsDisruptionBudget(d, p) {
			continue
		}
		name := DeploymentName(key.Name, p)
		want[name] = true
		if ours[name] == nil {
			other := &policyv1.PodDisruptionBudget{}
			err := r.c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: name}, other)
			if err == nil && other.Labels[LabelApp] != key.Name {
				logf.FromContext(ctx).Info("a PodDisruptionBudget that is not the app's has its process type's name: left as it is",
					"app", key.String(), "poddisruptionbudget", name)
				continue
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("app %s: get poddisruptionbudget %s: %w", key, name, err)
			}
		}
		ac := disruptionBudget(d.App, p)
		if err := r.c.Apply(ctx, ac, client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("app %s: apply poddisruptionbudget %s: %w", key, *ac.Name, err)
		}
	}
	for name, pdb := range ours {
		if want[name] {
			continue
		}
		if err := r.delete(ctx, pdb); err != nil {
			return fmt.Errorf("app %s: delete poddisruptionbudget %s: %w", key, name, err)
		}
	}
	return nil
}

// deleteDisruptionBudgets deletes the app's PodDisruptionBudgets.
func (r *Runtime) deleteDisruptionBudgets(ctx context.Context, app client.ObjectKey) error {
	err := r.c.DeleteAllOf(ctx, &policyv1.PodDisruptionBudget{}, client.InNamespace(app.Namespace),
		client.MatchingLabels{LabelApp: app.Name}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("app %s: delete poddisruptionbudgets: %w", app, err)
	}
	return nil
}
