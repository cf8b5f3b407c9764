package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"bex.co/bex/deployer/api/crds"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// ControlPlane is a real etcd + kube-apiserver with bex's CRDs installed.
type ControlPlane struct {
	// Config reaches the API server as a cluster admin.
	Config *rest.Config
	// Client is a controller-runtime client whose scheme knows bex's kinds and
	// Kubernetes' built-in ones.
	Client client.Client
	// Scheme is Client's scheme.
	Scheme *runtime.Scheme
	// Kubeconfig is the path of a kubeconfig file for kubectl, as a cluster admin.
	Kubeconfig string

	env *envtest.Environment
}

// Stop stops kube-apiserver and etcd.
func (c *ControlPlane) Stop() error { return c.env.Stop() }

// StartControlPlane starts etcd and kube-apiserver from bin/ with their data under
// dir, and installs bex's CRDs (waiting until they are served).
func StartControlPlane(dir string) (*ControlPlane, error) {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := Binary(b); err != nil {
			return nil, err
		}
	}
	apiserver, _ := Binary("kube-apiserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	crdObjs, err := crds.All()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := appv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		// kube-apiserver, etcd and kubectl sit side by side in bin/.
		BinaryAssetsDirectory: filepath.Dir(apiserver),
		CRDInstallOptions:     envtest.CRDInstallOptions{CRDs: crdObjs, Scheme: scheme},
		Scheme:                scheme,
	}
	// etcd and kube-apiserver die with the test binary, even when it is killed (a
	// test timeout, ^C): envtest starts them without a parent-death signal, so they
	// are started through setpriv, which sets one and then execs the daemon.
	etcdPath, err := withParentDeathSignal(dir, filepath.Join(filepath.Dir(apiserver), "etcd"))
	if err != nil {
		return nil, err
	}
	apiserverPath, err := withParentDeathSignal(dir, apiserver)
	if err != nil {
		return nil, err
	}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd"), Path: etcdPath}
	env.ControlPlane.GetAPIServer().Path = apiserverPath
	// envtest's default service range is a /24: too small for tests with a Service
	// per app by the thousand. A real cluster's is larger too.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	cp := &ControlPlane{Config: cfg, Scheme: scheme, env: env}
	if cp.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = env.Stop()
		return nil, err
	}
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "bex-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kubeconfig, 0o600); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return cp, nil
}

// withParentDeathSignal writes a script that runs bin with SIGKILL as its
// parent-death signal, and returns the script's path.
func withParentDeathSignal(dir, bin string) (string, error) {
	setpriv, err := Binary("setpriv")
	if err != nil {
		return "", err
	}
	script := filepath.Join(dir, filepath.Base(bin)+"-pdeathsig")
	content := fmt.Sprintf("#!/bin/sh\nexec %s --pdeathsig KILL -- %s \"$@\"\n", setpriv, bin)
	return script, os.WriteFile(script, []byte(content), 0o755)
}

// SharedControlPlane returns the control plane of this test binary, started on first
// use. Tests that share it use their own namespaces or names.
func SharedControlPlane(t testing.TB) *ControlPlane {
	t.Helper()
	return Shared(t, "controlplane", func(dir string) (*ControlPlane, func() error, error) {
		cp, err := StartControlPlane(dir)
		if err != nil {
			return nil, nil, err
		}
		return cp, cp.Stop, nil
	})
}

var namespaceSeq atomic.Int64

// Namespace creates a namespace of its own for one test, named prefix-<n>, so that
// tests sharing the control plane never see each other's objects.
func (c *ControlPlane) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", prefix, namespaceSeq.Add(1))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}
