package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/volumearchive"
)

// localVolumes adapts the local runtime's Volumes to the backend's
// VolumeStore: app names in the gitserver's namespace, and an archive the
// runtime refuses as an Invalid error (the sender's to fix).
type localVolumes struct {
	v         *local.Volumes
	namespace string
}

var _ backend.VolumeStore = localVolumes{}

func (l localVolumes) key(app string) types.NamespacedName {
	return types.NamespacedName{Namespace: l.namespace, Name: app}
}

func (l localVolumes) Usage(_ context.Context, app, name string) (int64, int64, error) {
	return l.v.Usage(l.key(app), name)
}

func (l localVolumes) Backup(ctx context.Context, app, name string, w io.Writer) error {
	return l.v.Backup(ctx, l.key(app), name, w)
}

func (l localVolumes) Restore(ctx context.Context, app, name string, r io.Reader) error {
	return restoreError(l.v.Restore(ctx, l.key(app), name, r), app, name)
}

// Pauses: the app's containers that mount the volume are paused meanwhile.
func (localVolumes) Pauses() bool { return true }

// restoreError is an archive the runtime refused as an Invalid error (the
// sender's to fix).
func restoreError(err error, app, name string) error {
	if errors.Is(err, volumearchive.ErrBadArchive) {
		return backend.Errorf(backend.Invalid, "volumes:restore refused the archive, and the volume %s of %s is as it was: %v", name, app, err)
	}
	return err
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

// newLocalVolumes reaches the volumes of the local runtime on this machine, with
// the deployer's state dir and containerd (the defaults of local.Config but
// these, as newLocalOneOffs sets them).
func newLocalVolumes(stateDir, containerdAddr, containerdNS, namespace string, log *slog.Logger) (backend.VolumeStore, io.Closer, error) {
	addr := containerdAddr
	if addr == "" {
		addr = filepath.Join(stateDir, "containerd", "containerd.sock")
	}
	cfg := local.DefaultConfig()
	cfg.Address, cfg.Namespace, cfg.StateDir = strings.TrimPrefix(addr, "unix://"), containerdNS, filepath.Join(stateDir, "runtime")
	v, err := local.NewVolumes(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	return localVolumes{v: v, namespace: namespace}, v, nil
}
