package main

import (
	"errors"
	"io"

	containerd "github.com/containerd/containerd/v2/client"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/builder"
	"bex.co/bex/deployer"
	deployruntime "bex.co/bex/deployer/runtime"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/volumearchive"
)

// The runtime is chosen once: --runtime (the deployer's and the gitserver's)
// names a runtimeKind here, and every part that depends on it (the deployer's
// runtime, and the gitserver's logs, one-offs, volumes' data, deploy:image's
// image store and the disk's measure) is made by that kind, in
// runtime_local.go or runtime_kube.go. No other file of cmd/bex compares the
// flag's value (layout_test.go checks it).

// runtimeKind makes what each command needs of one runtime.
type runtimeKind interface {
	// deployer makes the deployer's runtime, with the settings of cfg it
	// needs; the runtime's stop, if it has one, is left in c.closeRuntime.
	deployer(c *deployerCmd, mgr ctrl.Manager, cfg *deployer.Config) (deployruntime.Runtime, error)
	// gitserver makes the gitserver's parts of the runtime. A part that
	// cannot be made on this machine is off, with a warning, as the
	// gitserver still serves pushes without it.
	gitserver(c *gitserverCmd, env gitserverEnv) (*gitserverRuntime, error)
}

// gitserverEnv is what the gitserver has made before its runtime's parts.
type gitserverEnv struct {
	restCfg *rest.Config
	// kc reads and writes through the API (the local one-offs'); apps reads
	// the Apps from the informers' cache (the kubernetes volumes').
	kc   client.Client
	apps client.Reader
	// repos is the pipeline's repositories, whose disk (and compaction) the
	// machine's Storage counts.
	repos *pipeline.Pipeline
	// builder is the builder, whose disk the machine's Storage measures.
	builder *builder.Builder
}

// gitserverRuntime is the runtime as the gitserver uses it.
type gitserverRuntime struct {
	// logs reads the apps' runtime logs.
	logs backend.RuntimeLogs
	// oneOffs runs `run`, the release phase and postdeploy; nil: off.
	oneOffs deployruntime.OneOffs
	// volumes reads, backs up and restores the volumes' data; nil: off.
	volumes backend.VolumeStore
	// storage measures and prunes the machine's disk; nil on a cluster,
	// whose disks are the nodes' and the registry's.
	storage backend.Storage
	// images is the containerd deploy:image pulls into on one machine (nil:
	// deploy:image pushes to the registry, with --push, or is off).
	images *containerd.Client
	// configSecrets reads the Secrets config vars take values from (a
	// database link's), for masking them in what agents see of an app's
	// output: on one machine, where the gitserver reads them for one-offs
	// anyway; nil on a cluster, whose RBAC gives the gitserver none.
	configSecrets client.Reader
	// closers end what the parts hold open, when the gitserver stops.
	closers []io.Closer
}

// close ends what the parts hold open, the last made first.
func (r *gitserverRuntime) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		_ = r.closers[i].Close()
	}
}

// runtimeNamed is the one switch on --runtime's value: false when it names no
// runtime (each command says so in its own words).
func runtimeNamed(name string) (runtimeKind, bool) {
	switch name {
	case "local":
		return localRuntime{}, true
	case "kubernetes":
		return kubeRuntime{}, true
	}
	return nil, false
}

// restoreError is an archive the runtime refused as an Invalid error (the
// sender's to fix), on either runtime.
func restoreError(err error, app, name string) error {
	if errors.Is(err, volumearchive.ErrBadArchive) {
		return backend.Errorf(backend.Invalid, "volumes:restore refused the archive, and the volume %s of %s is as it was: %v", name, app, err)
	}
	return err
}
