package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/deployer"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/databases/cluster"
	deployruntime "bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/gitserver/backend"
)

// kubeRuntime is --runtime kubernetes: a Deployment per process type, pods for
// the one-offs and the volumes' transfers, the logs read through the API.
type kubeRuntime struct{}

func (kubeRuntime) deployer(c *deployerCmd, mgr ctrl.Manager, dcfg *deployer.Config) (deployruntime.Runtime, error) {
	cfg := kube.DefaultConfig()
	cfg.HostUsers = c.hostUsers
	cfg.VolumeStorageClass = c.volumeClass
	cfg.RegistryDelete, cfg.RegistryInsecure, cfg.RegistryConfig = c.registryDelete, c.registryInsecure, c.registryConfig
	// Deployment events say when a rollout moves; no need to poll often.
	dcfg.WatchDeployments, dcfg.RequeueWhileRolling = true, 30*time.Second
	rt, err := kube.New(cfg, mgr.GetClient())
	if err != nil {
		return nil, err
	}
	// Managed databases: Postgres through CloudNativePG, Redis as a
	// StatefulSet, their pods confined as the apps' are.
	dbCfg := cluster.DefaultConfig()
	dbCfg.Postgres, dbCfg.Redis = imageVersion(c.clusterPostgresImage), imageVersion(c.redisImage)
	dbCfg.PostgresUID, dbCfg.PostgresGID = c.clusterPostgresUID, c.clusterPostgresGID
	dbCfg.StorageClass, dbCfg.Pods = c.volumeClass, cfg
	if err := (&cluster.Reconciler{Client: mgr.GetClient(), Config: dbCfg}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return rt, nil
}

func (kubeRuntime) gitserver(c *gitserverCmd, env gitserverEnv) (*gitserverRuntime, error) {
	logs := kubeLogs{namespace: c.namespace}
	// Pod logs are a subresource stream, which controller-runtime's client
	// does not read: client-go's.
	var err error
	if logs.pods, err = kubernetes.NewForConfig(env.restCfg); err != nil {
		return nil, err
	}
	rt := &gitserverRuntime{logs: logs}
	if rt.oneOffs, err = newKubeOneOffs(c.hostUsers, env.restCfg); err != nil {
		return nil, err
	}
	if c.volumeHelperImage == "" {
		c.log.Warn("volumes' backups and restores are off: --volume-helper-image is not set (bex's own image)")
	} else if rt.volumes, err = newKubeVolumes(c.volumeHelperImage, c.hostUsers, env.restCfg, env.apps, c.namespace); err != nil {
		return nil, err
	}
	// No storage: the disks are the nodes' and the registry's, and system:df
	// says so. deploy:image copies into the registry with --push, else is off.
	return rt, nil
}

// kubeLogs reads the apps' pods' logs through the API server.
type kubeLogs struct {
	namespace string
	pods      kubernetes.Interface
}

func (l kubeLogs) Logs(ctx context.Context, app string, o backend.LogOptions, w io.Writer) error {
	if l.pods == nil {
		return fmt.Errorf("on a cluster, read the logs with: kubectl logs -n %s -l %s=%s --prefix", l.namespace, appv1.LabelApp, app)
	}
	return kube.ReadLogs(ctx, l.pods, types.NamespacedName{Namespace: l.namespace, Name: app},
		kube.LogOptions{Follow: o.Follow, Lines: o.Lines, Process: o.Process}, w)
}

// newKubeOneOffs is the kubernetes runtime's one-off pods, confined as the
// deployer's pods are (hostUsers as its --host-users).
func newKubeOneOffs(hostUsers bool, restCfg *rest.Config) (deployruntime.OneOffs, error) {
	cfg := kube.DefaultConfig()
	cfg.HostUsers = hostUsers
	return kube.NewOneOffs(cfg, restCfg)
}

// kubeVolumes adapts the kubernetes runtime's VolumeData to the backend's
// VolumeStore: the App read from the API (its helper pod is owned by it), a
// refused archive as an Invalid error, a transfer of the volume already
// running as a Conflict.
type kubeVolumes struct {
	v         *kube.VolumeData
	apps      client.Reader
	namespace string
}

var _ backend.VolumeStore = kubeVolumes{}

func (k kubeVolumes) Usage(ctx context.Context, app, name string) (int64, int64, error) {
	return k.v.Usage(ctx, types.NamespacedName{Namespace: k.namespace, Name: app}, name)
}

func (k kubeVolumes) app(ctx context.Context, name string) (*appv1.App, error) {
	a := &appv1.App{}
	if err := k.apps.Get(ctx, types.NamespacedName{Namespace: k.namespace, Name: name}, a); err != nil {
		return nil, err
	}
	return a, nil
}

func (k kubeVolumes) Backup(ctx context.Context, app, name string, w io.Writer) error {
	a, err := k.app(ctx, app)
	if err != nil {
		return err
	}
	return busyError(k.v.Backup(ctx, a, name, w))
}

func (k kubeVolumes) Restore(ctx context.Context, app, name string, r io.Reader) error {
	a, err := k.app(ctx, app)
	if err != nil {
		return err
	}
	return restoreError(busyError(k.v.Restore(ctx, a, name, r)), app, name)
}

// Pauses: nothing pauses pods across a cluster.
func (kubeVolumes) Pauses() bool { return false }

func busyError(err error) error {
	if errors.Is(err, kube.ErrVolumeBusy) {
		return backend.Errorf(backend.Conflict, "%v", err)
	}
	return err
}

// newKubeVolumes is the kubernetes runtime's volume transfers: helper pods of
// image (bex's own), confined as the one-offs are (hostUsers as the deployer's
// --host-users).
func newKubeVolumes(image string, hostUsers bool, restCfg *rest.Config, apps client.Reader, namespace string) (backend.VolumeStore, error) {
	cfg := kube.DefaultConfig()
	cfg.HostUsers, cfg.HelperImage = hostUsers, image
	v, err := kube.NewVolumeData(cfg, restCfg)
	if err != nil {
		return nil, err
	}
	return kubeVolumes{v: v, apps: apps, namespace: namespace}, nil
}
