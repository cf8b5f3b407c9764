package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"bex.co/bex/internal/pki"
)

// controlPlane is etcd and kube-apiserver through envtest, as internal/testenv
// runs them for the tests, with everything under DIR/mgmt.
type controlPlane struct {
	env    *envtest.Environment
	config *rest.Config
}

// startControlPlane starts etcd (its data in dir/etcd, kept from one start to the
// next) and kube-apiserver (its certificates made afresh in dir/apiserver) from
// bins, and writes an admin kubeconfig to kubeconfig.
func startControlPlane(dir string, bins map[string]string, kubeconfig string) (*controlPlane, error) {
	// envtest makes the API server's certificates only into an empty directory,
	// and knows their CA only when it made them.
	certDir := filepath.Join(dir, "apiserver")
	if err := os.RemoveAll(certDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	scripts := filepath.Join(dir, "bin")
	if err := os.MkdirAll(scripts, 0o755); err != nil {
		return nil, err
	}
	etcd, err := withParentDeathSignal(scripts, bins["etcd"])
	if err != nil {
		return nil, err
	}
	apiserver, err := withParentDeathSignal(scripts, bins["kube-apiserver"])
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: filepath.Dir(bins["kubectl"]),
		// A loaded machine starts kube-apiserver in more than envtest's 20 s.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
		// envtest prepares a webhook certificate even for no webhook: in DIR too.
		WebhookInstallOptions: envtest.WebhookInstallOptions{LocalServingCertDir: filepath.Join(dir, "envtest-webhook")},
	}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd"), Path: etcd}
	api := env.ControlPlane.GetAPIServer()
	api.Path = apiserver
	api.CertDir = certDir
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	cp := &controlPlane{env: env, config: cfg}
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "capdmgmt-admin", Groups: []string{"system:masters"}}, nil)
	if err == nil {
		var data []byte
		if data, err = user.KubeConfig(); err == nil {
			err = pki.WriteFile(kubeconfig, data, 0o600)
		}
	}
	if err != nil {
		_ = cp.stop()
		return nil, fmt.Errorf("write %s: %w", kubeconfig, err)
	}
	return cp, nil
}

func (c *controlPlane) stop() error { return c.env.Stop() }

// withParentDeathSignal writes a script into dir that runs bin with SIGKILL as
// its parent-death signal (envtest starts its daemons without one), and returns
// the script's path.
func withParentDeathSignal(dir, bin string) (string, error) {
	script := filepath.Join(dir, filepath.Base(bin))
	content := fmt.Sprintf("#!/bin/sh\nexec setpriv --pdeathsig KILL -- %s \"$@\"\n", bin)
	return script, pki.WriteFile(script, []byte(content), 0o755)
}
