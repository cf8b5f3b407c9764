package databases

import (
	"time"

	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
)

// Finalizer holds a Database until its server, volume, address and Secret are
// gone.
const Finalizer = "app.bex.co/database"

// Network gives databases a stable address that linked instances reach.
type Network interface {
	// Host is the address linked instances reach every database at (the apps'
	// gateway), each on its own port.
	Host() netip.Addr
	// Expose leads port on Host to target, the server's instance now; it
	// replaces what name led there before. name is the database's runtime key.
	Expose(ctx context.Context, name string, port uint16, target netip.AddrPort) error
	// Unexpose removes name's address; a name with none is no error.
	Unexpose(ctx context.Context, name string) error
}

// Reconciler runs Databases on the local runtime.
type Reconciler struct {
	Client  client.Client
	Runtime runtime.Runtime
	Network Network
	Config  Config
	// Usage measures the bytes in use on a volume of the runtime key's
	// (status.usedBytes); nil: not measured.
	Usage func(key types.NamespacedName, volume string) (used int64, err error)

	mu      sync.Mutex
	exposed map[string]netip.AddrPort // runtime key → the target Expose was last given
}

// SetupWithManager registers the reconciler: Databases, and the Apps that link
// to one (its status.links).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.Runtime == nil || r.Network == nil {
		return errors.New("databases: the reconciler needs a Client, a Runtime and a Network")
	}
	if err := r.Config.Validate(); err != nil {
		return err
	}
	r.exposed = map[string]netip.AddrPort{}
	return ctrl.NewControllerManagedBy(mgr).For(&appv1.Database{}).Named("database").
		// One at a time: the port of a new database is chosen among the others'.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Owns(&corev1.Secret{}).
		Watches(&appv1.App{}, handler.EnqueueRequestsFromMapFunc(LinkedBy)).
		Complete(r)
}

// Reconcile runs one Database and reports its state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	db := &appv1.Database{}
	if err := r.Client.Get(ctx, req.NamespacedName, db); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !db.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, db)
	}
	if !controllerutil.ContainsFinalizer(db, Finalizer) {
		patch := client.MergeFrom(db.DeepCopy())
		controllerutil.AddFinalizer(db, Finalizer)
		return ctrl.Result{}, r.Client.Patch(ctx, db, patch)
	}
	before := db.DeepCopy()
	res, err := r.reconcile(ctx, db)
	db.Status.ObservedGeneration = db.Generation
	if !equality.Semantic.DeepEqual(before.Status, db.Status) {
		if perr := r.Client.Status().Patch(ctx, db, client.MergeFrom(before)); perr != nil && !apierrors.IsNotFound(perr) {
			err = errors.Join(err, perr)
		}
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, db *appv1.Database) (ctrl.Result, error) {
	links, err := Links(ctx, r.Client, db)
	if err != nil {
		return ctrl.Result{}, err
	}
	db.Status.Links = links
	img := r.Config.image(db.Spec.Engine)
	db.Status.Image, db.Status.Version = img.Ref, img.Version
	if msg := VersionUnavailable(db, img); msg != "" {
		r.fail(db, "VersionUnavailable", msg)
		return ctrl.Result{}, nil
	}
	if n := max(db.Spec.Instances, 1); n > r.Config.MaxInstances {
		r.fail(db, "TooManyInstances", fmt.Sprintf("%d instances asked for; this platform runs at most %d (one machine: 1)", n, r.Config.MaxInstances))
		return ctrl.Result{}, nil
	}
	if db.Status.Port == 0 {
		port, err := r.freePort(ctx, db)
		if err != nil {
			r.fail(db, "NoPort", err.Error())
			return ctrl.Result{}, nil
		}
		// Kept before anything uses it, so a crash cannot hand it out twice.
		before := db.DeepCopy()
		db.Status.Port = int32(port)
		db.Status.Host = r.Network.Host().String()
		if db.Status.Phase == "" {
			db.Status.Phase = appv1.DatabaseCreating
		}
		if err := r.Client.Status().Patch(ctx, db, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, err
		}
	}
	db.Status.Host = r.Network.Host().String()
	if err := r.ensureSecret(ctx, db); err != nil {
		return ctrl.Result{}, err
	}
	st, err := r.Runtime.Sync(ctx, desired(db, img))
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime: %w", err)
	}
	addrs := st.Addresses[string(db.Spec.Engine)]
	switch {
	case st.Failure != "" && len(addrs) == 0:
		r.fail(db, st.Failure, st.Message)
		return r.retry(ctx, db)
	case len(addrs) == 0:
		db.Status.Phase = appv1.DatabaseCreating
		meta.SetStatusCondition(&db.Status.Conditions, metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionFalse,
			Reason: "Starting", Message: "the server is starting", ObservedGeneration: db.Generation})
		return ctrl.Result{RequeueAfter: r.Config.RequeueStarting}, nil
	}
	if err := r.expose(ctx, db, addrs[0]); err != nil {
		return ctrl.Result{}, err
	}
	db.Status.Phase = appv1.DatabaseRunning
	meta.SetStatusCondition(&db.Status.Conditions, metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionTrue,
		Reason: "Accepting", Message: "accepting connections", ObservedGeneration: db.Generation})
	r.measure(db)
	if !st.RolledOut {
		return ctrl.Result{RequeueAfter: r.Config.RequeueStarting}, nil
	}
	return ctrl.Result{RequeueAfter: r.Config.RequeueRunning}, nil
}

// usedBytesStep is what status.usedBytes is rounded down to, so that a
// database that writes does not rewrite its status at every look.
const usedBytesStep = 1 << 20

// measure sets status.usedBytes from the data volume's file system; a
// volume that cannot be measured now keeps the last figure.
func (r *Reconciler) measure(db *appv1.Database) {
	if r.Usage == nil {
		return
	}
	if used, err := r.Usage(db.RuntimeKey(), volumeName); err == nil {
		db.Status.UsedBytes = used / usedBytesStep * usedBytesStep
	}
}

// retry has the runtime try a failed server again once RetryFailed has passed
// since the last try: the runtime remembers a failed release and does not
// start it again by itself, but a database has nobody to push again. Its
// image may come later (bex up --local-bases imports the stand-ins after the
// deployer starts), or what made it crash (memory, the disk) may be gone. The
// try is an annotation (app.bex.co/restartedAt, as ps:restart's), so that it
// outlives a restart of the deployer and does not restart a server that runs.
func (r *Reconciler) retry(ctx context.Context, db *appv1.Database) (ctrl.Result, error) {
	now := time.Now()
	if last, err := time.Parse(time.RFC3339Nano, db.Annotations[appv1.RestartedAtAnnotation]); err == nil {
		if wait := r.Config.RetryFailed - now.Sub(last); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	patch := client.MergeFrom(db.DeepCopy())
	if db.Annotations == nil {
		db.Annotations = map[string]string{}
	}
	db.Annotations[appv1.RestartedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
	// The patch's event brings the next reconcile, with the new token.
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, db, patch))
}

// fail marks db Failed with reason and message.
func (r *Reconciler) fail(db *appv1.Database, reason, msg string) {
	db.Status.Phase = appv1.DatabaseFailed
	meta.SetStatusCondition(&db.Status.Conditions, metav1.Condition{Type: appv1.ReadyCondition, Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: db.Generation})
}

// expose leads the database's port to target when it is not already.
func (r *Reconciler) expose(ctx context.Context, db *appv1.Database, target netip.AddrPort) error {
	key := db.RuntimeKey().String()
	r.mu.Lock()
	same := r.exposed[key] == target
	r.mu.Unlock()
	if same {
		return nil
	}
	if err := r.Network.Expose(ctx, key, uint16(db.Status.Port), target); err != nil {
		return fmt.Errorf("address of database %s: %w", db.Name, err)
	}
	r.mu.Lock()
	r.exposed[key] = target
	r.mu.Unlock()
	return nil
}

// freePort is the lowest port of the range no other Database has.
func (r *Reconciler) freePort(ctx context.Context, db *appv1.Database) (int, error) {
	var list appv1.DatabaseList
	if err := r.Client.List(ctx, &list); err != nil {
		return 0, err
	}
	used := map[int32]bool{}
	for _, o := range list.Items {
		if o.UID != db.UID {
			used[o.Status.Port] = true
		}
	}
	for p := r.Config.PortMin; p <= r.Config.PortMax; p++ {
		if !used[int32(p)] {
			return p, nil
		}
	}
	return 0, fmt.Errorf("every port of %d-%d is taken: destroy a database you no longer use", r.Config.PortMin, r.Config.PortMax)
}

// ensureSecret makes the credentials Secret, or brings its address up to
// date; the password is made once and never changes here.
func (r *Reconciler) ensureSecret(ctx context.Context, db *appv1.Database) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: db.Namespace, Name: appv1.CredentialsSecret(db.Name)}}
	_, err := controllerutil.CreateOrPatch(ctx, r.Client, s, func() error { return FillCredentials(s, db, r.Client.Scheme()) })
	if err != nil {
		return fmt.Errorf("credentials of database %s: %w", db.Name, err)
	}
	return nil
}

// reconcileDelete stops the server, removes its volume, address and Secret.
func (r *Reconciler) reconcileDelete(ctx context.Context, db *appv1.Database) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(db, Finalizer) {
		return ctrl.Result{}, nil
	}
	key := db.RuntimeKey()
	if err := r.Network.Unexpose(ctx, key.String()); err != nil {
		return ctrl.Result{}, fmt.Errorf("address of database %s: %w", db.Name, err)
	}
	r.mu.Lock()
	delete(r.exposed, key.String())
	r.mu.Unlock()
	if err := r.Runtime.Delete(ctx, key); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing database %s: %w", db.Name, err)
	}
	// Owner references act only where a garbage collector runs; bex up's API
	// runs none.
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: db.Namespace, Name: appv1.CredentialsSecret(db.Name)}}
	if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("credentials of database %s: %w", db.Name, err)
	}
	patch := client.MergeFrom(db.DeepCopy())
	controllerutil.RemoveFinalizer(db, Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, db, patch))
}
