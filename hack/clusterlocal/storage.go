package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
// mount namespace: the mounts end with it, and nothing is mounted on the host.
func (l *layout) mountAppVolumes() error {
	for i := range appVolumes {
		img, dir := l.appVolumeImage(i), l.appVolumeDir(i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
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

// unmountAppVolumes undoes mountAppVolumes when the node stops.
func (l *layout) unmountAppVolumes() {
	for i := range appVolumes {
		_ = syscall.Unmount(l.appVolumeDir(i), syscall.MNT_DETACH)
	}
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
func (l *layout) appStorageManifests() string {
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
            - {key: kubernetes.io/hostname, operator: In, values: [%s]}
`, i, appVolumeSize>>20, appStorageClass, l.appVolumeDir(i), nodeName)
	}
	return b.String()
}
