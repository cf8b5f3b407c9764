package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/databases"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The tests run the reconciler against a real kube-apiserver with
// CloudNativePG's CRDs (infra/cnpg/crds, the module's, unchanged), and a real
// kube-controller-manager running only what owning and deleting need: the
// garbage collector, the StatefulSet controller (the Redis pod and its claim)
// and the claims' protection. No kubelet and no operator run: a test marks a
// pod ready, or writes a Cluster's status, where they would.

// controlPlane is the shared API server with CloudNativePG's CRDs installed
// and the controller manager started after them (its garbage collector
// discovers the kinds when it starts).
func controlPlane(t *testing.T) *testenv.ControlPlane {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	testenv.Shared(t, "cnpg-crds", func(string) (struct{}, func() error, error) {
		root, err := testenv.RepoRoot()
		if err != nil {
			return struct{}{}, nil, err
		}
		_, err = envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(root, "infra", "cnpg", "crds")}, ErrorIfPathMissing: true})
		return struct{}{}, func() error { return nil }, err
	})
	testenv.Shared(t, "kube-controller-manager", func(dir string) (*exec.Cmd, func() error, error) {
		return startControllerManager(dir, cp.Kubeconfig)
	})
	return cp
}

// startControllerManager runs kube-controller-manager from bin/ with the
// controllers the tests need, serving nothing; it dies with the test binary.
func startControllerManager(dir, kubeconfig string) (*exec.Cmd, func() error, error) {
	bin, err := testenv.Binary("kube-controller-manager")
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	log, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig,
		"--controllers", "garbage-collector-controller,statefulset-controller,persistentvolumeclaim-protection-controller",
		"--leader-elect=false", "--secure-port=0", "--profiling=false")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); log.Close() }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		return nil
	}
	return cmd, stop, nil
}

type env struct {
	t  *testing.T
	c  client.Client
	ns string
}

func testConfig() Config {
	c := DefaultConfig()
	c.Postgres = databases.Image{Ref: "registry.example/cnpg/postgresql:15", Version: "15"}
	c.Redis = databases.Image{Ref: "registry.example/redis:7", Version: "7"}
	c.StorageClass = "fast"
	return c
}

// start runs the reconciler in a manager of its own, on a namespace of its
// own.
func start(t *testing.T, cfg Config) *env {
	t.Helper()
	e, r := startWith(t, cfg, nil)
	if !r.postgres {
		t.Fatal("CloudNativePG's Cluster kind is installed, but the reconciler did not find it")
	}
	return e
}

// startWith is start with the manager's options changed by opts.
func startWith(t *testing.T, cfg Config, opts func(*ctrl.Options)) (*env, *Reconciler) {
	t.Helper()
	cp := controlPlane(t)
	ns := cp.Namespace(t, "databases")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	skip := true
	o := ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: &skip},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	}
	if opts != nil {
		opts(&o)
	}
	mgr, err := ctrl.NewManager(cp.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Client: mgr.GetClient(), Config: cfg}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	return &env{t: t, c: cp.Client, ns: ns}, r
}

func (e *env) create(name string, engine appv1.DatabaseEngine, mutate ...func(*appv1.Database)) *appv1.Database {
	e.t.Helper()
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: appv1.DatabaseSpec{Engine: engine, Size: resource.MustParse("1Gi")}}
	for _, m := range mutate {
		m(db)
	}
	if err := e.c.Create(context.Background(), db); err != nil {
		e.t.Fatal(err)
	}
	return db
}

func (e *env) get(name string, obj client.Object) error {
	return e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, obj)
}

func (e *env) db(name string) *appv1.Database {
	e.t.Helper()
	db := &appv1.Database{}
	if err := e.get(name, db); err != nil {
		e.t.Fatal(err)
	}
	return db
}

func (e *env) eventually(what string, f func() error) {
	e.t.Helper()
	testenv.Eventually(e.t, 60*time.Second, what, f)
}

// waitPhase waits until the database is in phase with the Ready condition's
// reason, and returns it.
func (e *env) waitPhase(name string, phase appv1.DatabasePhase, reason string) *appv1.Database {
	e.t.Helper()
	var db *appv1.Database
	e.eventually(fmt.Sprintf("database %s %s (%s)", name, phase, reason), func() error {
		db = e.db(name)
		c := ready(db)
		if db.Status.Phase != phase || c == nil || c.Reason != reason || c.ObservedGeneration != db.Generation {
			return fmt.Errorf("status %+v", db.Status)
		}
		return nil
	})
	return db
}

func ready(db *appv1.Database) *metav1.Condition {
	for i := range db.Status.Conditions {
		if db.Status.Conditions[i].Type == appv1.ReadyCondition {
			return &db.Status.Conditions[i]
		}
	}
	return nil
}

// cnpgCluster reads the Cluster named name.
func (e *env) cnpgCluster(name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ClusterGVK)
	return u, e.get(name, u)
}

// gone waits until every object is not found.
func (e *env) gone(what string, objs ...client.Object) {
	e.t.Helper()
	e.eventually(what+" gone", func() error {
		var left []string
		for _, o := range objs {
			err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: o.GetName()}, o)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return err
			default:
				left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %s", strings.Join(left, ", "))
		}
		return nil
	})
}
