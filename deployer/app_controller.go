package deployer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
)

// Finalizer holds an App until its processes and endpoints are gone.
const Finalizer = "app.bex.co/processes"

// Config is the reconciler's configuration; cmd/bex fills it, starting from
// DefaultConfig.
type Config struct {
	// BaseDomain gives each app its default host, <app>.<BaseDomain>.
	BaseDomain string
	// URLScheme is "https" (or "http" behind another TLS terminator).
	URLScheme string
	// HTTPSPort, when not 443, is part of the URL (development on unprivileged ports).
	HTTPSPort int
	// KeepReleases is how many releases of an app are kept; the current one is never
	// pruned.
	KeepReleases int
	// ImageRepo is the repository the builder names images under (the builder's
	// Config.ImageRepo): an app's images are <ImageRepo>/<app>. When the runtime
	// can remove images (runtime.Images), the images of pruned releases under
	// that name are removed with them, and all of them when the App is deleted;
	// empty removes none. Images of other names are never touched.
	ImageRepo string
	// RequeueWhileRolling is how soon a rollout in progress is looked at again.
	RequeueWhileRolling time.Duration
	// Concurrency is how many Apps are reconciled at once.
	Concurrency int
	// WatchDeployments reconciles an App when one of its Deployments, pods or
	// volume claims changes (the Kubernetes runtime): rollouts are then followed by events, and
	// RequeueWhileRolling can be long.
	WatchDeployments bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{BaseDomain: "localhost", URLScheme: "https", HTTPSPort: 443, KeepReleases: 20, RequeueWhileRolling: time.Second, Concurrency: 4}
}

// Validate reports every problem of c at once, each naming its field.
func (c Config) Validate() error {
	var errs []error
	if c.BaseDomain == "" {
		errs = append(errs, errors.New("Config.BaseDomain: required"))
	}
	if c.URLScheme != "https" && c.URLScheme != "http" {
		errs = append(errs, fmt.Errorf("Config.URLScheme %q: want http or https", c.URLScheme))
	}
	if c.HTTPSPort < 0 || c.HTTPSPort > 65535 {
		errs = append(errs, fmt.Errorf("Config.HTTPSPort %d: want 1 to 65535, or 0 for 443", c.HTTPSPort))
	}
	if c.KeepReleases < 1 {
		errs = append(errs, fmt.Errorf("Config.KeepReleases %d: must be at least 1", c.KeepReleases))
	}
	if r := c.ImageRepo; r != "" && (strings.ContainsAny(r, " @") || strings.HasSuffix(r, "/") || strings.Contains(r[strings.LastIndex(r, "/")+1:], ":")) {
		errs = append(errs, fmt.Errorf("Config.ImageRepo %q: not a repository name like bex.local or registry.example:5000/apps", r))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("Config.Concurrency %d: must be at least 1", c.Concurrency))
	}
	if c.RequeueWhileRolling <= 0 {
		errs = append(errs, fmt.Errorf("Config.RequeueWhileRolling %s: must be positive", c.RequeueWhileRolling))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deployer: %w", err)
	}
	return nil
}

// +kubebuilder:rbac:groups=app.bex.co,resources=apps,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=app.bex.co,resources=apps/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=app.bex.co,resources=releases,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// AppReconciler reconciles Apps with a runtime.
type AppReconciler struct {
	Client client.Client
	// APIReader reads around the cache, for release numbering (a Release just
	// recorded by a push may not be in the cache yet).
	APIReader client.Reader
	Runtime   runtime.Runtime
	Events    events.EventRecorder
	Config    Config
}

// scope carries what the phases learn, for the status computed at the end.
type scope struct {
	app *appv1.App
	// synced is set after reconcileRuntime ran the runtime.
	synced bool
	// recorded is set when reconcileRelease recorded a release: the App's spec has
	// moved on, and the next reconcile runs it.
	recorded bool
	status   runtime.Status
}

type phaseFunc func(context.Context, *scope) (ctrl.Result, error)

// SetupWithManager registers the reconciler.
func (r *AppReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.APIReader == nil || r.Runtime == nil {
		return errors.New("deployer: the reconciler needs a Client, an APIReader and a Runtime")
	}
	if err := r.Config.Validate(); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).For(&appv1.App{}).Named("app").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Config.Concurrency})
	if r.Config.WatchDeployments {
		b = b.Owns(&appsv1.Deployment{})
		// A volume taken out of the spec is reported (status.volumes) until
		// its claim is gone, which Kubernetes' pvc-protection decides once the
		// last pod that mounts it ended: that deletion is this App's news.
		b = b.Owns(&corev1.PersistentVolumeClaim{})
		// A crash loop or an image the kubelet cannot pull shows on the pods
		// only: their Deployment's status does not change, and without this
		// the failure waited for RequeueWhileRolling (or the progress deadline)
		// where the local runtime reports it at once. Pods name their App by
		// label (they are owned by ReplicaSets, not by the App).
		b = b.Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
			app := o.GetLabels()[appv1.LabelApp]
			if app == "" {
				return nil
			}
			return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: app}}}
		}))
	}
	if n, ok := r.Runtime.(runtime.Notifier); ok {
		events := make(chan event.GenericEvent)
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case key := <-n.Changes():
					app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
					select {
					case events <- event.GenericEvent{Object: app}:
					case <-ctx.Done():
						return nil
					}
				}
			}
		})); err != nil {
			return err
		}
		b = b.WatchesRawSource(source.Channel(events, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

// Reconcile makes one App's processes match its spec and reports what serves.
func (r *AppReconciler) Reconcile(ctx context.Context, req ctrl.Request) (retRes ctrl.Result, reterr error) {
	app := &appv1.App{}
	if err := r.Client.Get(ctx, req.NamespacedName, app); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !app.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, app)
	}
	if !controllerutil.ContainsFinalizer(app, Finalizer) {
		patch := client.MergeFrom(app.DeepCopy())
		controllerutil.AddFinalizer(app, Finalizer)
		return ctrl.Result{}, r.Client.Patch(ctx, app, patch)
	}

	before := app.DeepCopy()
	s := &scope{app: app}
	defer func() {
		phase := app.Status.Phase
		r.updateStatus(s)
		if reterr == nil {
			app.Status.ObservedGeneration = app.Generation
		}
		if err := r.Client.Status().Patch(ctx, app, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
		if app.Status.Phase != phase && r.Events != nil {
			kind := "Normal"
			if app.Status.Phase == appv1.AppPhaseFailed {
				kind = "Warning"
			}
			r.Events.Eventf(app, nil, kind, string(app.Status.Phase), "Reconcile", "%s", phaseMessage(app))
		}
	}()
	return doReconcile(ctx, s, []phaseFunc{r.reconcileRelease, r.reconcileRuntime, r.reconcileReleases})
}

// doReconcile runs the phases, collecting their errors and the soonest requeue.
func doReconcile(ctx context.Context, s *scope, phases []phaseFunc) (ctrl.Result, error) {
	var res ctrl.Result
	var errs []error
	for _, phase := range phases {
		r, err := phase(ctx, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.RequeueAfter > 0 && (res.RequeueAfter == 0 || r.RequeueAfter < res.RequeueAfter) {
			res.RequeueAfter = r.RequeueAfter
		}
	}
	return res, kerrors.NewAggregate(errs)
}

// reconcileRelease records a release when the App's spec no longer matches the
// release it names: an image set through the API directly (cause Deploy), or config
// vars or process commands changed (cause Config or Scale). So every change that
// restarts processes has a number in the history, whoever made it. Replicas alone
// are not a release: scaling restarts nothing.
func (r *AppReconciler) reconcileRelease(ctx context.Context, s *scope) (ctrl.Result, error) {
	app := s.app
	if app.Spec.Image == "" {
		return ctrl.Result{}, nil
	}
	key := client.ObjectKey{Namespace: app.Namespace, Name: fmt.Sprintf("%s-v%d", app.Name, app.Spec.Release)}
	// A Release's spec never changes once written, so the cache's copy, when it
	// is this App's and matches, says for sure that nothing is to record: every
	// reconcile of a rollout (each instance ready, each status) is spared a read
	// of the API server. Only a miss or a difference is read again from the
	// server, as a new release must never be recorded from a stale cache.
	if app.Spec.Release > 0 {
		cached := &appv1.Release{}
		if err := r.Client.Get(ctx, key, cached); err == nil && metav1.IsControlledBy(cached, app) && releaseChange(cached, app) == "" {
			return ctrl.Result{}, nil
		}
	}
	var current *appv1.Release
	if app.Spec.Release > 0 {
		rel := &appv1.Release{}
		err := r.APIReader.Get(ctx, key, rel)
		switch {
		case err == nil:
			current = rel
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	ch := releases.Change{Actor: "api"}
	switch ch.Cause = releaseChange(current, app); ch.Cause {
	case appv1.ReleaseCauseDeploy:
		ch.Description = "Deploy " + app.Spec.Image
	case appv1.ReleaseCauseConfig:
		ch.Description = "Change config vars"
	case appv1.ReleaseCauseScale:
		ch.Description = "Change process types"
	default:
		return ctrl.Result{}, nil
	}
	rec := &releases.Recorder{Client: r.Client, Reader: r.APIReader, Namespace: app.Namespace}
	n, err := rec.Record(ctx, app.Name, ch)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("recording a release for the change of %s: %w", app.Name, err)
	}
	s.recorded = true
	if r.Events != nil {
		r.Events.Eventf(app, nil, "Normal", "Released", "Release", "Release v%d: %s", n, ch.Description)
	}
	return ctrl.Result{}, nil
}

// releaseChange is the cause of the release app's spec asks for beyond
// current (nil: none was recorded): its image, its config vars, its process
// types' commands; "" when it asks for none.
func releaseChange(current *appv1.Release, app *appv1.App) appv1.ReleaseCause {
	switch {
	case current == nil || current.Spec.Image != app.Spec.Image:
		return appv1.ReleaseCauseDeploy
	case !sameEnv(current.Spec.Config.Env, app.Spec.Env):
		return appv1.ReleaseCauseConfig
	case !sameCommands(current.Spec.Config.Processes, app.Spec.Processes):
		return appv1.ReleaseCauseScale
	}
	return ""
}

// sameEnv compares config vars, nil and empty alike.
func sameEnv(a, b []appv1.EnvVar) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return equality.Semantic.DeepEqual(a, b)
}

// sameCommands compares the process types and their commands, not their scale.
func sameCommands(a, b map[string]appv1.ProcessSpec) bool {
	if len(a) != len(b) {
		return false
	}
	for name, p := range a {
		q, ok := b[name]
		if !ok || !slices.Equal(p.Command, q.Command) {
			return false
		}
	}
	return true
}

// reconcileRuntime asks the runtime to run the App's release.
func (r *AppReconciler) reconcileRuntime(ctx context.Context, s *scope) (ctrl.Result, error) {
	app := s.app
	if app.Spec.Image == "" || s.recorded {
		return ctrl.Result{}, nil
	}
	st, err := r.Runtime.Sync(ctx, runtime.Desired{
		App: app, Release: app.Spec.Release, Image: app.Spec.Image, Processes: app.Spec.Processes,
		Env: app.Spec.Env, HealthCheck: app.Spec.HealthCheck, Suspended: app.Spec.Suspended,
		Restarts: restarts(app), Cron: app.Spec.Cron, CronRuns: app.CronRuns(),
		Volumes: app.Spec.Volumes,
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime: %w", err)
	}
	s.synced, s.status = true, st
	if !st.RolledOut && st.Failure == "" {
		return ctrl.Result{RequeueAfter: r.Config.RequeueWhileRolling}, nil
	}
	return ctrl.Result{}, nil
}

// restarts are the restart tokens of the app's process types (ps:restart): the
// annotations the runtime acts on. nil when none was ever restarted.
func restarts(app *appv1.App) map[string]string {
	var out map[string]string
	for p := range app.Spec.Processes {
		if t := app.RestartToken(p); t != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[p] = t
		}
	}
	return out
}

// reconcileReleases prunes the oldest Releases beyond Config.KeepReleases. The
// release in spec and the one serving are never pruned. With a runtime that
// stores images (runtime.Images) and a Config.ImageRepo, a pruned release's image
// goes first, unless a kept release or a container still uses it; the Release is
// deleted only once that succeeded, so a failed removal is retried at the next
// reconcile instead of leaking the image.
func (r *AppReconciler) reconcileReleases(ctx context.Context, s *scope) (ctrl.Result, error) {
	var list appv1.ReleaseList
	if err := r.Client.List(ctx, &list, client.InNamespace(s.app.Namespace), client.MatchingLabels{releases.LabelApp: s.app.Name}); err != nil {
		return ctrl.Result{}, err
	}
	items := list.Items
	sort.Slice(items, func(i, j int) bool { return items[i].Spec.Number > items[j].Spec.Number })
	// The cache may not have the Release a push just recorded yet. Nothing is
	// pruned from that older list (it lacks the newest image, which may be an
	// older release's again); the requeue prunes once the cache caught up, as no
	// Release event reconciles the App. (A Release deleted by hand is not
	// waited for.)
	if s.app.Spec.Release > 0 && !slices.ContainsFunc(items, func(r appv1.Release) bool { return r.Spec.Number == s.app.Spec.Release }) {
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.app.Namespace, Name: fmt.Sprintf("%s-v%d", s.app.Name, s.app.Spec.Release)}, &appv1.Release{})
		if err == nil {
			return ctrl.Result{RequeueAfter: r.Config.RequeueWhileRolling}, nil
		}
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
	}
	var res ctrl.Result
	var prune []appv1.Release
	keep := []string{s.app.Spec.Image}
	for i, rel := range items {
		n := rel.Spec.Number
		if i < r.Config.KeepReleases || n == s.app.Spec.Release || n == s.app.Status.Revision || n == s.status.Serving {
			keep = append(keep, rel.Spec.Image)
			continue
		}
		prune = append(prune, rel)
	}
	if len(prune) == 0 {
		return ctrl.Result{}, nil
	}
	if imgs, ok := r.Runtime.(runtime.Images); ok && r.Config.ImageRepo != "" {
		var remove []string
		for _, rel := range prune {
			remove = append(remove, rel.Spec.Image)
		}
		inUse, err := imgs.RemoveImages(ctx, r.Config.ImageRepo+"/"+s.app.Name, remove, keep)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("removing the images of pruned releases: %w", err)
		}
		// A release whose instance still drains keeps its Release until the
		// instance is gone, so that a later reconcile removes its image.
		if len(inUse) > 0 {
			res.RequeueAfter = r.Config.RequeueWhileRolling
			prune = slices.DeleteFunc(prune, func(rel appv1.Release) bool { return slices.Contains(inUse, rel.Spec.Image) })
		}
	}
	var errs []error
	for i := range prune {
		if err := r.Client.Delete(ctx, &prune[i]); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return res, kerrors.NewAggregate(errs)
}

// reconcileDelete stops the App's processes, removes its images (a runtime
// that stores them, runtime.Images) and Releases, and lets it go.
func (r *AppReconciler) reconcileDelete(ctx context.Context, app *appv1.App) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(app, Finalizer) {
		return ctrl.Result{}, nil
	}
	if err := r.Runtime.Delete(ctx, types.NamespacedName{Namespace: app.Namespace, Name: app.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing the processes of %s: %w", app.Name, err)
	}
	// The Releases are owned by the App, but owner references only act where a
	// garbage collector runs, and `bex up`'s API runs none: they are deleted here,
	// so that an app made again under the same name starts a history of its own.
	var list appv1.ReleaseList
	if err := r.Client.List(ctx, &list, client.InNamespace(app.Namespace), client.MatchingLabels{releases.LabelApp: app.Name}); err != nil {
		return ctrl.Result{}, err
	}
	// The app's images go with it (every name under <ImageRepo>/<app>, built
	// or released), before its Releases: they name the digests a registry
	// cannot list. The finalizer stays until that succeeded, so that a failed
	// removal is retried instead of leaking the images.
	if imgs, ok := r.Runtime.(runtime.Images); ok && r.Config.ImageRepo != "" {
		var refs []string
		for _, rel := range list.Items {
			refs = append(refs, rel.Spec.Image)
		}
		if app.Spec.Image != "" {
			refs = append(refs, app.Spec.Image)
		}
		inUse, err := imgs.RemoveRepository(ctx, r.Config.ImageRepo+"/"+app.Name, refs)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("removing the images of %s: %w", app.Name, err)
		}
		if inUse {
			return ctrl.Result{RequeueAfter: r.Config.RequeueWhileRolling}, nil
		}
	}
	for i := range list.Items {
		if err := r.Client.Delete(ctx, &list.Items[i]); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("removing release %s: %w", list.Items[i].Name, err)
		}
	}
	// The app's webhook Secret is not removed here: it lives in the gitserver's
	// secrets namespace, and the deployer may read no Secrets at all. apps:destroy
	// (the gitserver, which owns those Secrets) deletes it.
	patch := client.MergeFrom(app.DeepCopy())
	controllerutil.RemoveFinalizer(app, Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, app, patch))
}
