package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/gitserver/backend"
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
	err := l.v.Restore(ctx, l.key(app), name, r)
	if errors.Is(err, local.ErrBadArchive) {
		return backend.Errorf(backend.Invalid, "volumes:restore refused the archive, and the volume %s of %s is as it was: %v", name, app, err)
	}
	return err
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
