package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
)

// The apps' volumes on this node. A cluster in the cloud provisions them
// (Hetzner's CSI driver: docs/cluster.md); this node has no disk to give but
// its own, so it is set up as an administrator sets up local storage with no
// provisioner: a fixed set of local PersistentVolumes of the StorageClass
// appStorageClass, each an ext4 file system of its own, to which the apps'
// claims bind (WaitForFirstConsumer: the scheduler binds a claim when its first
// pod is placed). A file system per volume, as on a real disk: its size bounds
// what the app writes (ENOSPC inside the app), which a hostPath directory
// would not.
//
// On the cluster of Docker containers (hack/cluster-capd.sh) the same file
// systems are mounted on the host, under DIR/volumes, which every machine
// mounts at the same path (its bind mount takes the file systems along): a
// volume there is a local volume of every node, found by a pod on any machine,
// and a machine's loss loses none of it (as the gitserver's and
// the registry's data). They are mounted before the first machine is made
// (volumes-capd) and unmounted once the last is gone (unmount-capd).
//
// A volume is used once: a claim deleted (volumes:destroy, apps:destroy)
// leaves its volume Released, and a volume made again binds another. Enough
// are made for the tests of infra/cluster (the apps' volumes, and one per
// Postgres instance of CloudNativePG's Clusters) and a person trying it; up in a DIR
// whose volumes are all used needs a new DIR.
const (
	appStorageClass = "bex-local"
	appVolumes      = 16
	appVolumeSize   = 256 << 20 // bytes; a claim asks for at most this
)

func (l *layout) appVolumeImage(i int) string {
	return l.path("volumes", "apps", fmt.Sprintf("pv-%d.img", i))
}
func (l *layout) appVolumeDir(i int) string {
	return l.path("volumes", "apps", fmt.Sprintf("pv-%d", i))
}

// mountAppVolumes makes the volumes' file systems (once: up in the same DIR
// keeps their files) and loop-mounts each at its directory, in the node's
// mount namespace (the one-node cluster: the mounts end with it, and nothing is
// mounted on the host), or in the host's (the cluster of containers). A
// directory mounted already is left as it is.
func (l *layout) mountAppVolumes() error {
	for i := range appVolumes {
		img, dir := l.appVolumeImage(i), l.appVolumeDir(i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if mounted, err := mountinfo.Mounted(dir); err != nil {
			return err
		} else if mounted {
			continue
		}
		_, err := os.Stat(img)
		fresh := errors.Is(err, os.ErrNotExist)
		if fresh {
			if err := makeExt4(img, appVolumeSize); err != nil {
				return err
			}
		}
		// mount -o loop sets the loop device's autoclear: it is detached when
		// the file system is unmounted, or when this namespace ends.
		if out, err := exec.Command("mount", "-o", "loop,nosuid,nodev", img, dir).CombinedOutput(); err != nil {
			return fmt.Errorf("mount %s: %v: %s", img, err, strings.TrimSpace(string(out)))
		}
		if fresh {
			// A new volume is empty, as on one machine: mkfs's lost+found
			// is not the app's.
			if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// unmountAppVolumes undoes mountAppVolumes (when the node stops, or at down of
// the cluster of containers): every mount at a volume's directory, a loop
// device's autoclear detaching it.
func (l *layout) unmountAppVolumes() error {
	var errs []error
	for i := range appVolumes {
		dir := l.appVolumeDir(i)
		for {
			mounted, err := mountinfo.Mounted(dir)
			if errors.Is(err, fs.ErrNotExist) || err == nil && !mounted {
				break
			}
			if err == nil {
				err = syscall.Unmount(dir, syscall.MNT_DETACH)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// makeExt4 writes a file of size bytes, allocated on the disk now (a full
// host disk shows at creation, not as an app's write error later), with an
// ext4 file system on it.
func makeExt4(img string, size int64) error {
	tmp := img + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("allocate %s: %w", img, err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", tmp).CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, img)
}

// appStorageManifests are the StorageClass and the local PersistentVolumes of
// the apps' volumes, on this node.
func (l *layout) appStorageManifests() string { return l.storageManifests(false) }

// sharedStorageManifests are the StorageClass and the PersistentVolumes of the
// apps' volumes on the cluster of containers: local volumes at the directories
// every machine mounts, of every node.
func (l *layout) sharedStorageManifests() string { return l.storageManifests(true) }

func (l *layout) storageManifests(shared bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
`, appStorageClass)
	for i := range appVolumes {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: PersistentVolume
metadata: {name: bex-local-app-%d}
spec:
  capacity: {storage: %dMi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: %s
  volumeMode: Filesystem
  local: {path: %s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
`, i, appVolumeSize>>20, appStorageClass, l.appVolumeDir(i))
		if shared {
			// Every machine has it (its mount of DIR/volumes): a local
			// volume of every node. Local, not hostPath: the kubelet gives
			// a local volume to the pod's fsGroup (Postgres runs as 26),
			// and a hostPath volume to no one.
			b.WriteString("            - {key: kubernetes.io/os, operator: In, values: [linux]}\n")
			continue
		}
		fmt.Fprintf(&b, "            - {key: kubernetes.io/hostname, operator: In, values: [%s]}\n", nodeName)
	}
	return b.String()
}
