package controlplane_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/deployer/api/crds"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/machine/controlplane"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func binaries(t *testing.T) controlplane.Config {
	t.Helper()
	etcd, err := testenv.Binary("etcd")
	if err != nil {
		t.Fatal(err)
	}
	apiserver, err := testenv.Binary("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	return controlplane.Config{Dir: t.TempDir(), Etcd: etcd, APIServer: apiserver}
}

// start runs the control plane under a supervisor and returns an admin client.
func start(t *testing.T, cfg controlplane.Config) (*supervise.Supervisor, client.Client) {
	t.Helper()
	sup, c, _ := startCP(t, cfg)
	return sup, c
}

func newClient(t *testing.T, rc *rest.Config) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	_ = apiextensionsv1.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c, err := client.New(rc, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startCP(t *testing.T, cfg controlplane.Config) (*supervise.Supervisor, client.Client, *controlplane.ControlPlane) {
	t.Helper()
	cp, err := controlplane.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sup := supervise.New(nil)
	ctx := context.Background()
	for _, p := range []supervise.Process{cp.Etcd(), cp.APIServer()} {
		if _, err := sup.Start(ctx, p); err != nil {
			sup.Stop()
			t.Fatal(err)
		}
	}
	if err := cp.WriteKubeconfig(filepath.Join(cfg.Dir, "kubeconfig")); err != nil {
		t.Fatal(err)
	}
	rc, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	return sup, newClient(t, rc), cp
}

// The control plane comes up with bex's CRDs, kubectl works through the kubeconfig,
// and a restart on the same directory keeps the objects, the ports and the
// kubeconfig.
func TestControlPlaneKeepsStateAcrossRestarts(t *testing.T) {
	cfg := binaries(t)
	sup, c := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, c); err != nil {
		sup.Stop()
		t.Fatal(err)
	}
	// Installing again (every start does) is a no-op.
	if err := crds.Install(ctx, c); err != nil {
		sup.Stop()
		t.Fatal(err)
	}
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}}
	if err := c.Create(ctx, app); err != nil {
		sup.Stop()
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(cfg.Dir, "kubeconfig")
	before, _ := os.ReadFile(kubeconfig)
	if err := sup.Stop(); err != nil {
		t.Fatal(err)
	}

	sup, c = start(t, cfg)
	defer sup.Stop()
	after, _ := os.ReadFile(kubeconfig)
	if !bytes.Equal(before, after) {
		t.Error("the kubeconfig changed across a restart")
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(app), &appv1.App{}); err != nil {
		t.Fatalf("the App did not survive the restart: %v", err)
	}
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "get", "apps").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kept") {
		t.Fatalf("kubectl get apps: %v\n%s", err, out)
	}
	if _, err := clientcmd.LoadFromFile(kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// A second control plane on a directory whose ports are in use says so.
func TestPrepareRefusesTakenPorts(t *testing.T) {
	cfg := binaries(t)
	sup, _ := start(t, cfg)
	defer sup.Stop()
	_, err := controlplane.Prepare(cfg)
	if err == nil || !strings.Contains(err.Error(), "is taken: is another bex up running on this state dir?") {
		t.Fatalf("Prepare: %v", err)
	}
}
