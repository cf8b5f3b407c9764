package tenantnet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetNS runs fn on a thread in the network namespace at path; sockets fn opens
// stay in that namespace.
func InNetNS(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return err
	}
	defer target.Close()
	return onThread(func() error {
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns %s: %w", path, err)
		}
		return fn()
	})
}

// onThread runs fn on a locked OS thread of its own, which may leave the network
// namespace, and then puts the thread back into its own namespace. The thread
// lives on: a thread that ends takes with it the children it forked with a
// parent-death signal (Pdeathsig is per thread), such as the test harness's
// daemons. Only if it cannot go back does it end, locked, with its goroutine.
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		err = fn()
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// NewNetNS creates a network namespace and keeps it at path (a bind mount of the
// namespace, as `ip netns add` makes under /run/netns), so that it outlives this
// process: a container joins it by path, and a restarted bex finds it again.
func NewNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	f.Close()
	err = onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount: %w", err)
		}
		return nil
	})
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	return nil
}

// RemoveNetNS unmounts the namespace at path and removes the file. A path that is
// gone is not an error. The namespace itself ends once no process is in it.
func RemoveNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// IsNetNS reports whether path is a mounted network namespace.
func IsNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}
