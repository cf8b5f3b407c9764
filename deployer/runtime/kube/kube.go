package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// Runtime runs apps as Deployments and Services. It keeps no state of its own: every
// Sync reads the app's Deployments and applies the whole intent again, so a
// restarted deployer simply carries on.
type Runtime struct {
	cfg Config
	c   client.Client
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a Runtime that writes through c, whose scheme must know Kubernetes'
// apps/v1, batch/v1, core/v1 and policy/v1 kinds (client-go's scheme has them). cfg is completed with its defaults, then validated.
// c may read from a cache (a manager's client) as long as that cache watches
// Deployments; writes are server-side applies and deletes, which go to the API
// server.
func New(cfg Config, c client.Client) (*Runtime, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	if c == nil {
		return nil, errors.New("kube runtime: no client")
	}
	return &Runtime{cfg: cfg, c: c}, nil
}

// Config is the runtime's configuration, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }

// Sync applies one Deployment per process type of d, a PodDisruptionBudget per
// process type of two instances or more (disruption.go) and the web Service,
// deletes the Deployments and budgets of process types d no longer has (and
// the budgets of those scaled below two), applies a CronJob per cron job
// (cron.go), and reports the state of the
// Deployments as the API server returned them. Kubernetes does the rolling; Sync
// never waits. An error means the API server refused or could not be reached; an
// app that does not come up is reported in Status.Failure.
func (r *Runtime) Sync(ctx context.Context, d runtime.Desired) (runtime.Status, error) {
	if err := checkDesired(d); err != nil {
		return runtime.Status{}, err
	}
	key := d.Key()
	var list appsv1.DeploymentList
	if err := r.c.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{LabelApp: key.Name}); err != nil {
		return runtime.Status{}, fmt.Errorf("app %s: list deployments: %w", key, err)
	}
	existing := make(map[string]*appsv1.Deployment, len(list.Items))
	for i := range list.Items {
		dep := &list.Items[i]
		if p := dep.Labels[LabelProcess]; p != "" {
			// Without a process label it is not one of ours, whatever its app label.
			existing[p] = dep
		}
	}

	// Deployment names join app and process with "-", so app a-b's process c and
	// app a's process b-c would share a-b-c. Applying would take the other app's
	// Deployment over; refuse with a sentence instead.
	for _, p := range processOrder(d.Processes) {
		if _, ours := existing[p]; ours {
			continue
		}
		other := &appsv1.Deployment{}
		err := r.c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: DeploymentName(key.Name, p)}, other)
		if err == nil && other.Labels[LabelApp] != key.Name {
			return runtime.Status{}, fmt.Errorf("app %s: the Deployment %s for its %q process already belongs to %s; rename the process type or the app",
				key, other.Name, p, describeOwner(other))
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return runtime.Status{}, fmt.Errorf("app %s: get deployment %s: %w", key, DeploymentName(key.Name, p), err)
		}
	}

	// The claims first: a pod of a Deployment applied before its claim would
	// wait for it, and a claim that cannot be applied holds the release back.
	vols, err := r.syncVolumes(ctx, d)
	if err != nil {
		return runtime.Status{}, err
	}
	for _, v := range vols {
		if want := slices.ContainsFunc(d.Volumes, func(w appv1.Volume) bool { return w.Name == v.Name }); want && !v.Ready {
			return runtime.Status{Serving: servedRelease(existing[WebProcess]), Failure: appv1.VolumeFailedReason, Message: v.Message, Volumes: vols}, nil
		}
	}

	applied := make(map[string]*appsv1.Deployment, len(d.Processes))
	for _, p := range processOrder(d.Processes) {
		// The release the old pods serve is read before the template changes, and
		// carried over in a label: once the new template is applied, nothing
		// else on the Deployment says which release last completed.
		ac := deployment(r.cfg, d, p, servedRelease(existing[p]))
		if err := r.c.Apply(ctx, ac, client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			return runtime.Status{}, fmt.Errorf("app %s: apply deployment %s: %w", key, *ac.Name, err)
		}
		dep, err := fromApplied(ac)
		if err != nil {
			return runtime.Status{}, fmt.Errorf("app %s: deployment %s: %w", key, *ac.Name, err)
		}
		applied[p] = dep
	}
	// After the Deployments: the budgets share their names, which the check
	// above proved the app's.
	if err := r.syncDisruptionBudgets(ctx, d); err != nil {
		return runtime.Status{}, err
	}

	if hasProcess(d, WebProcess) {
		svc := service(r.cfg, d.App)
		if err := r.serviceIsOurs(ctx, d.App, *svc.Name); err != nil {
			return runtime.Status{}, err
		}
		if err := r.c.Apply(ctx, svc, client.FieldOwner(r.cfg.FieldManager), client.ForceOwnership); err != nil {
			return runtime.Status{}, fmt.Errorf("app %s: apply service %s: %w", key, *svc.Name, err)
		}
	} else if err := r.deleteService(ctx, key); err != nil {
		return runtime.Status{}, err
	}

	for p, dep := range existing {
		if hasProcess(d, p) {
			continue
		}
		if err := r.delete(ctx, dep); err != nil {
			return runtime.Status{}, fmt.Errorf("app %s: delete deployment %s of removed process %q: %w", key, dep.Name, p, err)
		}
	}
	// The release's pods tell what the Deployments do not: restarts, and why they
	// cannot run (a crash loop, an image that cannot be pulled).
	var pods corev1.PodList
	if err := r.c.List(ctx, &pods, client.InNamespace(key.Namespace),
		client.MatchingLabels{LabelApp: key.Name, LabelRelease: strconv.FormatInt(d.Release, 10)}); err != nil {
		return runtime.Status{}, fmt.Errorf("app %s: list pods: %w", key, err)
	}
	st := statusOf(d, applied, pods.Items)
	st.Volumes = vols
	if !st.RolledOut && st.Failure == "" {
		var recreated []string
		for _, p := range processOrder(d.Processes) {
			if len(volumesOf(d.Volumes, p)) > 0 {
				recreated = append(recreated, p)
			}
		}
		if len(recreated) > 0 {
			st.Note = fmt.Sprintf("%s stop before their new instances start (their volumes attach to one node at a time): a short downtime.", strings.Join(recreated, ", "))
		}
	}
	cron, err := r.syncCron(ctx, d)
	if err != nil {
		return runtime.Status{}, err
	}
	st.Cron = cron
	return st, nil
}

func describeOwner(dep *appsv1.Deployment) string {
	if app := dep.Labels[LabelApp]; app != "" {
		return "app " + app
	}
	return "something other than bex"
}

// Delete deletes the app's Deployments, PodDisruptionBudgets, CronJobs,
// PersistentVolumeClaims and Service. Deleting the App also removes
// them on a cluster (owner references and the garbage collector); Delete does not
// depend on that. Pods stop in the background, each with its grace period.
func (r *Runtime) Delete(ctx context.Context, app types.NamespacedName) error {
	err := r.c.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(app.Namespace),
		client.MatchingLabels{LabelApp: app.Name}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("app %s: delete deployments: %w", app, err)
	}
	if err := r.deleteDisruptionBudgets(ctx, app); err != nil {
		return err
	}
	if err := r.deleteCronJobs(ctx, app); err != nil {
		return err
	}
	if err := r.deleteVolumeClaims(ctx, app); err != nil {
		return err
	}
	return r.deleteService(ctx, app)
}

// serviceIsOurs refuses a Service name another object holds: applying with
// ForceOwnership would take its selector over, and the connections meant for
// it (a database's Service, <db>-rw or <db>-redis, with the passwords linked
// apps send) would reach this app's pods.
func (r *Runtime) serviceIsOurs(ctx context.Context, app *appv1.App, name string) error {
	var svc corev1.Service
	err := r.c.Get(ctx, types.NamespacedName{Namespace: app.Namespace, Name: name}, &svc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("app %s: service %s: %w", app.Name, name, err)
	}
	// An App of the same name made earlier (deleted, its Service not yet
	// collected) gives it over.
	if c := metav1.GetControllerOf(&svc); c != nil && c.Kind == "App" && c.Name == app.Name {
		return nil
	}
	return fmt.Errorf("app %s: the Service %s belongs to something else (a database's, or one made by hand): give the app another name", app.Name, name)
}

// deleteService deletes the app's Service if it is the app's (labelled so): a
// Service of that name that bex did not make is left alone.
func (r *Runtime) deleteService(ctx context.Context, app types.NamespacedName) error {
	var svc corev1.Service
	err := r.c.Get(ctx, types.NamespacedName{Namespace: app.Namespace, Name: ServiceName(app.Name)}, &svc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("app %s: get service: %w", app, err)
	}
	if svc.Labels[LabelApp] != app.Name {
		return nil
	}
	if err := r.delete(ctx, &svc); err != nil {
		return fmt.Errorf("app %s: delete service: %w", app, err)
	}
	return nil
}

// delete deletes obj if it is still the object that was read (same UID); it is gone
// either way afterwards. Propagation is in the background: foreground deletion
// would keep the object until the garbage collector has removed its pods, and
// nothing here waits for pods.
func (r *Runtime) delete(ctx context.Context, obj client.Object) error {
	err := r.c.Delete(ctx, obj, client.Preconditions{UID: ptrTo(obj.GetUID())},
		client.PropagationPolicy(metav1.DeletePropagationBackground))
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Conflict: the UID precondition failed, the object was replaced by a
		// newer one meanwhile, which is not ours to delete on this evidence.
		return nil
	}
	return err
}

// checkDesired rejects a Desired that cannot be written: the owner reference needs
// the App's UID, so d.App must be the object read from the API server.
func checkDesired(d runtime.Desired) error {
	if d.App == nil || d.App.Name == "" || d.App.Namespace == "" {
		return errors.New("kube runtime: Sync needs the App (name and namespace)")
	}
	if d.App.UID == "" {
		return fmt.Errorf("app %s: no UID: Sync needs the App as read from the API server, for owner references", d.Key())
	}
	if d.Image == "" {
		return fmt.Errorf("app %s: release %d has no image", d.Key(), d.Release)
	}
	return nil
}

// fromApplied turns the apply configuration that the API server's answer was decoded
// into back into a Deployment, status included.
func fromApplied(ac any) (*appsv1.Deployment, error) {
	b, err := json.Marshal(ac)
	if err != nil {
		return nil, err
	}
	dep := &appsv1.Deployment{}
	if err := json.Unmarshal(b, dep); err != nil {
		return nil, err
	}
	return dep, nil
}

func ptrTo[T any](v T) *T { return &v }
