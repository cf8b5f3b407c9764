package local

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// A sysfs shows the network devices of the network namespace of the process
// that mounted it, under /sys/class/net, /sys/devices/virtual/net and each
// device's net/ directory alike (the kernel tags those directories with their
// namespace). An instance cannot mount one itself: its user namespace does not
// own its network namespace (see withSysfsBind). So the runtime mounts one for
// it, from a thread that joined the instance's network namespace, as the host's
// root (which may), read-only, in the attachment's directory: the instance's
// /sys is a bind of that mount, and it sees its own lo and eth0, none of the
// host's devices nor another instance's veth or its counters.

// mountSysfs mounts a sysfs of the network namespace at netns on dir (made if
// missing), read-only.
func mountSysfs(netns, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ns, err := os.Open(netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("join %s: %w", netns, err)
			return
		}
		err = unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		// Back to the host's namespace before the thread serves anything else;
		// a thread that cannot go back dies with its goroutine (still locked).
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("mount a sysfs of %s: %w", netns, err)
	}
	return nil
}

// unmountSysfs unmounts what mountSysfs mounted on dir, if anything.
func unmountSysfs(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.SYSFS_MAGIC {
		return nil
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}
