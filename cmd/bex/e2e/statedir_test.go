package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// stateModeExceptions are the entries of a state dir that may be wider than 0600
// files and 0700 directories, and why.
var stateModeExceptions = map[string]fs.FileMode{
	// The state dir: others may open a path they know (ca.pem), list nothing.
	".": 0o711,
	// The local CA's certificate: users give it to curl and browsers.
	"ca.pem": 0o644,
	// The edge's own copy, in its 0700 directory (the edge writes it so).
	"edge/ca/ca.pem": 0o644,
}

// daemonsOwn are the trees whose modes the daemons set themselves: containerd's
// root (its snapshots must be as the images say) and buildkitd's root. bex only
// makes their top directories; the state dir's 0700 keeps them out of others'
// reach.
var daemonsOwn = []string{"containerd", "buildkitd/root"}

// tooWide walks the state dir dir and returns every entry wider than allowed:
// files beyond 0600, directories beyond 0700, the exceptions above and the
// daemons' own trees aside. Sockets are left to the listeners' test, which dials
// each as an unprivileged user; symbolic links have no mode of their own.
func tooWide(t *testing.T, dir string) (wide []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (a build's work dir)
			}
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		// The sysfs the local runtime mounts for an instance's network
		// namespace (runtime/net/<id>/sys, its /sys): the kernel's files, not
		// bex's, behind the 0700 directory of the namespace.
		var st unix.Statfs_t
		if d.IsDir() && unix.Statfs(path, &st) == nil && st.Type == unix.SYSFS_MAGIC {
			return fs.SkipDir
		}
		for _, own := range daemonsOwn {
			if rel == own {
				return fs.SkipDir
			}
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		mode := info.Mode()
		if mode&(fs.ModeSocket|fs.ModeSymlink) != 0 {
			return nil
		}
		allowed := fs.FileMode(0o600)
		if d.IsDir() {
			allowed = 0o700
		}
		if m, ok := stateModeExceptions[rel]; ok {
			allowed = m
		}
		// The resolv.conf and hosts bind-mounted into each app instance: its
		// processes (uids of the app's user namespace) read them. And the network
		// namespaces mounted there: the mode shown is the kernel's nsfs inode's.
		if strings.HasPrefix(rel, "runtime/net/") && (d.Name() == "resolv.conf" || d.Name() == "hosts") {
			allowed = 0o644
		}
		if strings.HasPrefix(rel, "runtime/net/") && d.Name() == "netns" {
			allowed = 0o444
		}
		if mode.Perm()&^allowed != 0 {
			wide = append(wide, rel+" "+mode.Perm().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return wide
}
