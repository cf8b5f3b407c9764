package kube

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// On a cluster a volume is a PersistentVolumeClaim per app and volume,
// ReadWriteOnce (the block storage of a cloud, Hetzner's CSI driver on CAPH,
// attaches to one node at a time), of Config.VolumeStorageClass. The Deployment
// of each process type that mounts one rolls out by Recreate: its old pods stop
// before the new ones start, since a new pod on another node could not attach
// the volume beside the old one; that is a short downtime, which the rollout's
// message says. Claims no longer in the spec are deleted: Kubernetes keeps them
// (pvc-protection) until no pod uses them, then their data goes with them.

// LabelVolume names the volume on its PersistentVolumeClaim.
const LabelVolume = "app.bex.co/volume"

// VolumeClaimName is the PersistentVolumeClaim of volume name of app.
func VolumeClaimName(app, name string) string { return app + "-vol-" + name }

// podVolumeName is the name of volume name in a pod's spec.
func podVolumeName(name string) string { return "vol-" + name }

func volumeClaim(cfg Config, app *appv1.App, v appv1.Volume) *corev1ac.PersistentVolumeClaimApplyConfiguration {
	spec := corev1ac.PersistentVolumeClaimSpec().
		WithAccessModes(corev1.ReadWriteOnce).
		WithResources(corev1ac.VolumeResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceStorage: v.Size}))
	if cfg.VolumeStorageClass != "" {
		spec.WithStorageClassName(cfg.VolumeStorageClass)
	}
	return corev1ac.PersistentVolumeClaim(VolumeClaimName(app.Name, v.Name), app.Namespace).
		WithLabels(map[string]string{LabelApp: app.Name, LabelVolume: v.Name}).
		WithOwnerReferences(ownerReference(app)).
		WithSpec(spec)
}

// withVolumeMounts mounts the volumes of vols in the container (before it is
// copied into its pod's spec).
func withVolumeMounts(c *corev1ac.ContainerApplyConfiguration, vols []appv1.Volume) {
	for _, v := range vols {
		c.WithVolumeMounts(corev1ac.VolumeMount().WithName(podVolumeName(v.Name)).WithMountPath(v.Path))
	}
}

// withVolumeClaims gives the pod the claims of vols.
func withVolumeClaims(pod *corev1ac.PodSpecApplyConfiguration, app string, vols []appv1.Volume) {
	for _, v := range vols {
		pod.WithVolumes(corev1ac.Volume().WithName(podVolumeName(v.Name)).
			WithPersistentVolumeClaim(corev1ac.PersistentVolumeClaimVolumeSource().WithClaimName(VolumeClaimName(app, v.Name))))
	}
}

// volumesOf are the volumes the pods of process mount.
func volumesOf(vols []appv1.Volume, process string) []appv1.Volume {
	var out []appv1.Volume
	for _, v := range vols {
		if v.MountedIn(process) {
			out = append(out, v)
		}
	}
	return out
}

// syncVolumes applies a claim per volume of d and deletes the app's other
// claims, and reports them all: a claim that exists is ready (a class that binds
// at the first consumer binds it when the first pod is scheduled); one being
// deleted says so.
func (r *Runtime) syncVolumes(ctx context.Context, d runtime.Desired) ([]appv1.VolumeStatus, error) {
	key := d.Key()
	var out []appv1.VolumeStatus
	want := map[string]bool{}
	for _, v := range d.Volumes {
		want[v.Name] = true
		vs := appv1.VolumeStatus{Name: v.Name, Ready: true}
		if err := r.c.Apply(ctx, volumeClaim(r.cfg, d.App, v), client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			// A claim's size cannot shrink, and grows only where its class allows.
			vs.Ready, vs.Message = false, fmt.Sprintf("PersistentVolumeClaim %s: %v", VolumeClaimName(key.Name, v.Name), err)
		}
		out = append(out, vs)
	}
	var claims corev1.PersistentVolumeClaimList
	if err := r.c.List(ctx, &claims, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name}); err != nil {
		return nil, fmt.Errorf("app %s: list volume claims: %w", key, err)
	}
	for i := range claims.Items {
		pvc := &claims.Items[i]
		name := pvc.Labels[LabelVolume]
		if name == "" || want[name] {
			continue
		}
		if pvc.DeletionTimestamp == nil {
			if err := r.delete(ctx, pvc); err != nil {
				return nil, fmt.Errorf("app %s: delete volume claim %s: %w", key, pvc.Name, err)
			}
		}
		out = append(out, appv1.VolumeStatus{Name: name, Message: "being deleted once no pod uses it"})
	}
	slices.SortFunc(out, func(a, b appv1.VolumeStatus) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, nil
}

// deleteVolumeClaims deletes every claim of the app (its deletion).
func (r *Runtime) deleteVolumeClaims(ctx context.Context, app client.ObjectKey) error {
	var claims corev1.PersistentVolumeClaimList
	if err := r.c.List(ctx, &claims, client.InNamespace(app.Namespace), client.MatchingLabels{LabelApp: app.Name}); err != nil {
		return fmt.Errorf("app %s: list volume claims: %w", app, err)
	}
	for i := range claims.Items {
		if claims.Items[i].Labels[LabelVolume] == "" {
			continue
		}
		if err := r.delete(ctx, &claims.Items[i]); err != nil {
			return fmt.Errorf("app %s: delete volume claim %s: %w", app, claims.Items[i].Name, err)
		}
	}
	return nil
}
