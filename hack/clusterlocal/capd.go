package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The commands hack/cluster-capd.sh runs: bex on a cluster whose machines are
// Docker containers (Cluster API's Docker provider), installed as on this
// machine's one-node cluster, from the same images and with the same settings,
// where the two differ only in what the machines are.
//
//	clusterlocal images DIR         make image and hack/nodeimages into DIR/images,
//	                                and bex's image as a docker archive (bex-docker.tar)
//	clusterlocal volumes-capd DIR   mount the apps' volumes under DIR/volumes/apps
//	                                (before the first machine is made: each machine's
//	                                mount of DIR/volumes takes them along)
//	clusterlocal install-capd DIR   install bex on the cluster of DIR/kubeconfig, with
//	                                the apps' volumes and the databases' server images
//	clusterlocal unmount-capd DIR   unmount the apps' volumes (once the machines are gone)
//
// install-capd takes NODE_IP from the environment: the address of the machine
// whose node ports it publishes (SSH_ADDR, HTTPS_ADDR: the control plane's, the
// machine a worker's loss leaves in place). DIR/volumes is the same directory on
// the host and in every machine (the local-capd overlay's extraMounts), so the
// gitserver's repositories and the registry's images live on this machine's disk
// and outlive any one machine.

// capdPatches are install-capd's patches over infra/bex besides bexPatches: the
// edge on every node, the control plane's among them (its taint keeps other pods
// off), so that the control plane's address serves HTTPS whichever worker is
// lost.
const capdPatches = `- target: {kind: DaemonSet, name: bex-edge}
  patch: |
    - op: add
      path: /spec/template/spec/tolerations
      value:
        - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}
`

func installCAPD(l *layout, root string) error {
	start := time.Now()
	ip, err := netip.ParseAddr(os.Getenv("NODE_IP"))
	if err != nil {
		return fmt.Errorf("NODE_IP: the address of the machine whose node ports serve (hack/cluster-capd.sh sets it): %w", err)
	}
	l.nodeIP = ip
	l.extraPatches = capdPatches
	if _, err := os.Stat(l.kubeconfig()); err != nil {
		return fmt.Errorf("no kubeconfig of the cluster: %w", err)
	}
	k := l.kubectl(filepath.Join(root, "bin"))
	// The databases' server images (from the machine's cache of stand-ins, or
	// mmdebstrap the first time) while bex installs.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	servers := startServerBuild(ctx)
	if err := l.makeVolumeDirs(); err != nil {
		return err
	}
	// bex's volumes and the apps' (mounted on the host by volumes-capd before the
	// first machine was made).
	if _, err := k(l.volumeManifests()+"---\n"+l.sharedStorageManifests(), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		return err
	}
	if err := l.installBex(root, k); err != nil {
		return err
	}
	if err := l.seedRegistry(ctx, k); err != nil {
		return err
	}
	imgs, err := servers.wait()
	if err != nil {
		return err
	}
	if err := imgs.push(ctx, l, k); err != nil {
		return err
	}
	if err := l.writeEnv(k); err != nil {
		return err
	}
	// The one-node cluster's network namespace is not this cluster's (the
	// machines are on Docker's network, which the host reaches directly).
	env, err := os.ReadFile(l.envFile())
	if err != nil {
		return err
	}
	var kept []string
	for _, line := range strings.Split(strings.TrimSuffix(string(env), "\n"), "\n") {
		if !strings.HasPrefix(line, "NODE_NETNS=") {
			kept = append(kept, line)
		}
	}
	if err := os.WriteFile(l.envFile(), []byte(strings.Join(kept, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	say("bex on the cluster in %.0f s", time.Since(start).Seconds())
	return nil
}

// capdImages builds what buildImages builds, then writes bex's image (an OCI
// archive) again as a docker archive, DIR/images/bex-docker.tar, which Debian's
// Docker (20.10) loads: CAPD copies images into the machines from Docker.
func capdImages(l *layout, root string) error {
	if err := os.MkdirAll(l.path("images"), 0o755); err != nil {
		return err
	}
	if err := l.buildImages(root); err != nil {
		return err
	}
	return dockerArchive(l.path("images", "bex.tar"), l.path("images", "bex-docker.tar"), bexImage)
}

// bexImage is the name make image gives bex's image here (VERSION=dev).
const bexImage = "bex.local/bex:dev"

// dockerArchive writes the one image of the OCI archive ociTar to out as a docker
// archive named ref.
func dockerArchive(ociTar, out, ref string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := os.Open(ociTar)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", ociTar, err)
		}
		name := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			w, err := os.Create(name)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
	idx, err := ocilayout.ImageIndexFromPath(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", ociTar, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 {
		return fmt.Errorf("%s holds %d images, not one", ociTar, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
