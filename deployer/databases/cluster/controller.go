package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/databases"
)

// Reasons of the Ready condition besides the runtimes' (appv1.*Reason).
const (
	// ReasonNoOperator: a Postgres database on a cluster where CloudNativePG's
	// Cluster kind is not served.
	ReasonNoOperator = "NoOperator"
	// ReasonTooManyInstances: a Redis database asked for more than one.
	ReasonTooManyInstances = "TooManyInstances"
	// ReasonRefused: the API server refused an object (CloudNativePG's
	// webhook, say), with its message.
	ReasonRefused = "Refused"
	// ReasonClusterFailed: CloudNativePG reports a phase it does not leave by
	// itself.
	ReasonClusterFailed = "ClusterFailed"
)

// Reconciler runs Databases on a cluster: Postgres as CloudNativePG Clusters,
// Redis as StatefulSets.
type Reconciler struct {
	Client client.Client
	Config Config

	// postgres: CloudNativePG's Cluster kind is served (SetupWithManager).
	postgres bool
	// secrets are the UIDs of the databases whose credentials Secret this
	// process made or found: it is made once, with the password, and never
	// read here (the deployer may create Secrets, not read them).
	secrets sync.Map
}

// SetupWithManager registers the reconciler: Databases, what they own, the
// pods of their servers (why one cannot run), and the Apps that link to one.
// Without CloudNativePG's Cluster kind (the operator is not installed), Redis
// databases run and Postgres ones report it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		return errors.New("databases: the reconciler needs a Client")
	}
	if err := r.Config.Validate(); err != nil {
		return err
	}
	_, err := mgr.GetRESTMapper().RESTMapping(ClusterGVK.GroupKind(), ClusterGVK.Version)
	switch {
	case err == nil:
		r.postgres = true
	case meta.IsNoMatchError(err):
		mgr.GetLogger().Info("CloudNativePG's Cluster kind is not served: Postgres databases are off until it is installed and the deployer restarted")
	default:
		return fmt.Errorf("databases: is CloudNativePG installed: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).For(&appv1.Database{}).Named("database").
		Owns(&appsv1.StatefulSet{}).
		Watches(&appv1.App{}, handler.EnqueueRequestsFromMapFunc(databases.LinkedBy)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(databaseOfPod))
	if r.postgres {
		cl := &unstructured.Unstructured{}
		cl.SetGroupVersionKind(ClusterGVK)
		b = b.Owns(cl)
	}
	return b.Complete(r)
}

// databaseOfPod maps a pod of a server to its Database.
func databaseOfPod(_ context.Context, o client.Object) []ctrl.Request {
	name := o.GetLabels()[appv1.LabelDatabase]
	if name == "" {
		name = o.GetLabels()[LabelCNPGCluster]
	}
	if name == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// Reconcile runs one Database and reports its state. A deleted Database takes
// what it owns with it through the garbage collector: the Cluster (and
// CloudNativePG's pods, claims, Services and Secrets, which the Cluster owns),
// the StatefulSet (and its claims: persistentVolumeClaimRetentionPolicy), the
// Service, the NetworkPolicy and the credentials Secret.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	db := &appv1.Database{}
	if err := r.Client.Get(ctx, req.NamespacedName, db); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !db.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	before := db.DeepCopy()
	err := r.reconcile(ctx, db)
	db.Status.ObservedGeneration = db.Generation
	if !equality.Semantic.DeepEqual(before.Status, db.Status) {
		if perr := r.Client.Status().Patch(ctx, db, client.MergeFrom(before)); perr != nil && !apierrors.IsNotFound(perr) {
			err = errors.Join(err, perr)
		}
	}
	return ctrl.Result{}, err
}

func (r *Reconciler) reconcile(ctx context.Context, db *appv1.Database) error {
	links, err := databases.Links(ctx, r.Client, db)
	if err != nil {
		return err
	}
	db.Status.Links = links
	redis := db.Spec.Engine == appv1.EngineRedis
	img := r.Config.Postgres
	db.Status.Host, db.Status.Port = PostgresHost(db.Name, db.Namespace), PostgresPort
	if redis {
		img = r.Config.Redis
		db.Status.Host, db.Status.Port = RedisHost(db.Name, db.Namespace), RedisPort
	}
	db.Status.Image, db.Status.Version = img.Ref, img.Version
	if msg := databases.VersionUnavailable(db, img); msg != "" {
		fail(db, "VersionUnavailable", msg)
		return nil
	}
	if n := max(db.Spec.Instances, 1); redis && n > 1 {
		fail(db, ReasonTooManyInstances, fmt.Sprintf("Redis runs as one instance: %d asked for; make it with --instances 1 (replicas are for Postgres)", n))
		return nil
	}
	if !redis && !r.postgres {
		fail(db, ReasonNoOperator, "Postgres needs CloudNativePG, which this cluster does not run: install it (hack/install-bex.sh does), then restart the deployer")
		return nil
	}
	if db.Status.Phase == "" {
		db.Status.Phase = appv1.DatabaseCreating
	}
	if err := r.ensureSecret(ctx, db); err != nil {
		return err
	}
	opts := []client.ApplyOption{client.FieldOwner(r.Config.FieldManager), client.ForceOwnership}
	if err := r.Client.Apply(ctx, networkPolicy(r.Config, db, links), opts...); err != nil {
		return fmt.Errorf("network policy of database %s: %w", db.Name, err)
	}
	if redis {
		return r.reconcileRedis(ctx, db, opts)
	}
	return r.reconcilePostgres(ctx, db, opts)
}

func (r *Reconciler) reconcilePostgres(ctx context.Context, db *appv1.Database, opts []client.ApplyOption) error {
	u, err := postgresCluster(r.Config, db)
	if err != nil {
		return err
	}
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...); err != nil {
		if refused(err) {
			fail(db, ReasonRefused, fmt.Sprintf("the Cluster was refused: %v", err))
			return nil
		}
		return fmt.Errorf("cluster of database %s: %w", db.Name, err)
	}
	cl := &unstructured.Unstructured{}
	cl.SetGroupVersionKind(ClusterGVK)
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(u), cl); err != nil {
		if apierrors.IsNotFound(err) { // not in the cache yet: its event comes
			starting(db, "the Cluster is being made")
			return nil
		}
		return err
	}
	st, err := statusOfCluster(cl)
	if err != nil {
		return fmt.Errorf("status of the Cluster of database %s: %w", db.Name, err)
	}
	if st.PGDataImageInfo != nil && st.PGDataImageInfo.MajorVersion > 0 {
		db.Status.Version = strconv.Itoa(st.PGDataImageInfo.MajorVersion)
	}
	phase := st.Phase
	if st.PhaseReason != "" {
		phase += ": " + st.PhaseReason
	}
	switch {
	case failedPhases[st.Phase]:
		fail(db, ReasonClusterFailed, "CloudNativePG: "+phase)
	case st.ReadyInstances > 0:
		msg := fmt.Sprintf("accepting connections (%d of %d instances ready)", st.ReadyInstances, max(db.Spec.Instances, 1))
		if st.Phase != "" && st.Phase != "Cluster in healthy state" {
			msg += "; CloudNativePG: " + phase
		}
		running(db, msg)
	default:
		return r.notReady(ctx, db, "CloudNativePG: "+phase)
	}
	return nil
}

func (r *Reconciler) reconcileRedis(ctx context.Context, db *appv1.Database, opts []client.ApplyOption) error {
	// A StatefulSet's claim templates are fixed once it is made: an existing
	// one is applied with its own.
	size, note := db.Spec.Size, ""
	sts := &appsv1.StatefulSet{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: db.Namespace, Name: RedisName(db.Name)}, sts); {
	case err == nil:
		if s, ok := claimSize(sts); ok {
			if s.Cmp(size) != 0 {
				note = fmt.Sprintf("; its disk stays %s (fixed when it was made)", s.String())
			}
			size = s
		}
	case apierrors.IsNotFound(err):
		sts = nil
	default:
		return err
	}
	if err := r.Client.Apply(ctx, redisStatefulSet(r.Config, db, size), opts...); err != nil {
		if refused(err) {
			fail(db, ReasonRefused, fmt.Sprintf("the StatefulSet was refused: %v", err))
			return nil
		}
		return fmt.Errorf("statefulset of database %s: %w", db.Name, err)
	}
	if err := r.Client.Apply(ctx, redisService(db), opts...); err != nil {
		return fmt.Errorf("service of database %s: %w", db.Name, err)
	}
	if sts != nil && sts.Status.ReadyReplicas > 0 {
		running(db, "accepting connections"+note)
		return nil
	}
	return r.notReady(ctx, db, "the server is starting")
}

// claimSize is the size of the StatefulSet's data claim template.
func claimSize(sts *appsv1.StatefulSet) (resource.Quantity, bool) {
	for _, t := range sts.Spec.VolumeClaimTemplates {
		if t.Name == volumeName {
			q, ok := t.Spec.Resources.Requests[corev1.ResourceStorage]
			return q, ok
		}
	}
	return resource.Quantity{}, false
}

// notReady reports a database with no ready server: Failed when the kubelet
// says why a pod of its servers cannot run, else Creating with msg.
func (r *Reconciler) notReady(ctx context.Context, db *appv1.Database, msg string) error {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(db.Namespace), client.MatchingLabels(serverPods(db))); err != nil {
		return fmt.Errorf("pods of database %s: %w", db.Name, err)
	}
	reason, why := trouble(pods.Items)
	switch {
	case reason == "":
		starting(db, msg)
	case reason == configErrorReason:
		// The Secret may be gone (deleted by hand): make it again.
		r.secrets.Delete(db.UID)
		fail(db, reason, why)
	default:
		fail(db, reason, why)
	}
	return nil
}

// configErrorReason is the kubelet's reason for a container whose env names
// a Secret or a key that is not there.
const configErrorReason = "CreateContainerConfigError"

// trouble is why a pod of pods cannot run, when the kubelet says so: a reason
// (the App API's, or the kubelet's) and a sentence naming the pod.
func trouble(pods []corev1.Pod) (string, string) {
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil {
			continue
		}
		for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			w := cs.State.Waiting
			if w == nil {
				continue
			}
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				return appv1.ImageNotFoundReason, fmt.Sprintf("%s cannot pull image %s: %s", pod.Name, cs.Image, w.Message)
			case "CrashLoopBackOff":
				return appv1.CrashLoopReason, fmt.Sprintf("%s keeps exiting: %d restarts", pod.Name, cs.RestartCount)
			case configErrorReason:
				return configErrorReason, fmt.Sprintf("%s cannot start: %s", pod.Name, w.Message)
			}
		}
	}
	return "", ""
}

// ensureSecret creates the credentials Secret once. An existing one is kept
// as it is: its password is the database's, and its address (host, port)
// never changes on a cluster.
func (r *Reconciler) ensureSecret(ctx context.Context, db *appv1.Database) error {
	if _, ok := r.secrets.Load(db.UID); ok {
		return nil
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: db.Namespace, Name: appv1.CredentialsSecret(db.Name)}}
	if err := databases.FillCredentials(s, db, r.Client.Scheme()); err != nil {
		return err
	}
	if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("credentials of database %s: %w", db.Name, err)
	}
	r.secrets.Store(db.UID, true)
	return nil
}

// refused: the API server will not take the object as it is (validation, a
// webhook's denial), so trying again changes nothing until the spec does.
func refused(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)
}

func fail(db *appv1.Database, reason, msg string) {
	db.Status.Phase = appv1.DatabaseFailed
	setReady(db, metav1.ConditionFalse, reason, msg)
}

func starting(db *appv1.Database, msg string) {
	db.Status.Phase = appv1.DatabaseCreating
	setReady(db, metav1.ConditionFalse, "Starting", msg)
}

func running(db *appv1.Database, msg string) {
	db.Status.Phase = appv1.DatabaseRunning
	setReady(db, metav1.ConditionTrue, "Accepting", msg)
}

func setReady(db *appv1.Database, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&db.Status.Conditions, metav1.Condition{Type: appv1.ReadyCondition, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: db.Generation})
}
