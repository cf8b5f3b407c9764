package local

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// managedBy marks the EndpointSlices this runtime writes (the label Kubernetes
// uses for the same purpose), so that it never touches slices of another writer.
const (
	labelManagedBy = discoveryv1.LabelManagedBy
	managedBy      = "local.runtime.bex.co"
	annotationID   = "app.bex.co/container"
)

// ensureService creates the app's selector-less Service if it is missing. Nothing
// routes through its ClusterIP (it has none); it exists because EndpointSlices
// belong to a Service by name, and tools expect to find it.
func (r *Runtime) ensureService(ctx context.Context, key types.NamespacedName, owner metav1.OwnerReference) error {
	svc := &corev1.Service{}
	err := r.kube.Get(ctx, key, svc)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get service %s: %w", key, err)
	}
	svc = &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
			Labels:          map[string]string{labelApp: key.Name},
			OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromString("http")}},
		},
	}
	if err := r.kube.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service %s: %w", key, err)
	}
	return nil
}

// publish writes the app's EndpointSlices from what is ready now: one slice per
// ready web instance of the serving gen. New slices are written before stale ones
// are deleted, so a watcher sees the new backends before the old ones leave.
func (r *Runtime) publish(ctx context.Context, a *appState) error {
	a.pubMu.Lock()
	defer a.pubMu.Unlock()
	r.mu.Lock()
	owner := a.owner
	type ep struct {
		id    string
		addr  string
		port  int
		index int
	}
	var eps []ep
	for _, inst := range a.instances {
		if inst.web() && inst.gen == a.serving && !a.serving.isZero() && inst.ready && !inst.leaving() {
			eps = append(eps, ep{inst.id, inst.addr.String(), inst.port, inst.index})
		}
	}
	release := a.serving.Release
	r.mu.Unlock()
	if owner == nil {
		return nil // not synced since this process started: Sync publishes
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].port < eps[j].port })
	var sig strings.Builder
	fmt.Fprintf(&sig, "r%d", release)
	for _, e := range eps {
		fmt.Fprintf(&sig, ",%s:%d", e.addr, e.port)
	}
	if sig.String() == a.published {
		return nil
	}
	a.published = "<failed>" // until this write succeeds

	want := map[string]bool{}
	for _, e := range eps {
		name := fmt.Sprintf("%s-%d", a.key.Name, e.port)
		want[name] = true
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.key.Namespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: a.key.Name,
					labelManagedBy:               managedBy,
					labelApp:                     a.key.Name,
					labelRelease:                 strconv.FormatInt(release, 10),
					labelProcess:                 webProcess,
					labelIndex:                   strconv.Itoa(e.index),
				},
				Annotations:     map[string]string{annotationID: e.id},
				OwnerReferences: []metav1.OwnerReference{*owner}},
			AddressType: addressType(e.addr),
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{e.addr},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(e.port))}},
		}
		// A slice is named by its instance's port, so a new instance's is a new
		// name: created at once, a read of the API server spared while a push
		// waits for the switch. One that exists is read and updated.
		if err := r.kube.Create(ctx, s.DeepCopy()); err == nil {
			continue
		} else if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create endpointslice %s/%s: %w", s.Namespace, s.Name, err)
		}
		cur := &discoveryv1.EndpointSlice{}
		err := r.kube.Get(ctx, client.ObjectKeyFromObject(s), cur)
		switch {
		case apierrors.IsNotFound(err):
			if err := r.kube.Create(ctx, s); err != nil {
				return fmt.Errorf("create endpointslice %s/%s: %w", s.Namespace, s.Name, err)
			}
		case err != nil:
			return fmt.Errorf("get endpointslice %s/%s: %w", s.Namespace, s.Name, err)
		case cur.AddressType != s.AddressType:
			// The address type is immutable: a slice of the host-network era is
			// replaced.
			if err := r.kube.Delete(ctx, cur); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete endpointslice %s/%s: %w", s.Namespace, s.Name, err)
			}
			if err := r.kube.Create(ctx, s); err != nil {
				return fmt.Errorf("create endpointslice %s/%s: %w", s.Namespace, s.Name, err)
			}
		default:
			s.ResourceVersion = cur.ResourceVersion
			if err := r.kube.Update(ctx, s); err != nil {
				return fmt.Errorf("update endpointslice %s/%s: %w", s.Namespace, s.Name, err)
			}
		}
	}
	if err := r.deleteSlices(ctx, a.key, want); err != nil {
		return err
	}
	a.published = sig.String()
	return nil
}

// deleteSlices deletes the app's slices whose names are not in keep.
func (r *Runtime) deleteSlices(ctx context.Context, key types.NamespacedName, keep map[string]bool) error {
	list := &discoveryv1.EndpointSliceList{}
	if err := r.kube.List(ctx, list, client.InNamespace(key.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: key.Name, labelManagedBy: managedBy}); err != nil {
		return fmt.Errorf("list endpointslices of %s: %w", key, err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		if keep[s.Name] {
			continue
		}
		if err := r.kube.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete endpointslice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

// deleteEndpoints removes the app's slices and Service.
func (r *Runtime) deleteEndpoints(ctx context.Context, key types.NamespacedName) error {
	if err := r.deleteSlices(ctx, key, nil); err != nil {
		return err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	if err := r.kube.Delete(ctx, svc); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %s: %w", key, err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// addressType is IPv4 for an instance's own address, FQDN for 127.0.0.1 (the host
// network): the API server refuses loopback addresses in IPv4 slices, while
// "127.0.0.1" is a valid FQDN address that any dialer takes as the IP literal it
// is.
func addressType(addr string) discoveryv1.AddressType {
	if a, err := netip.ParseAddr(addr); err == nil && a.Is4() && !a.IsLoopback() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeFQDN
}
