package up

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// The programs bex up runs or needs, and the Debian package or make target that
// brings each.
var programs = []struct{ name, from string }{
	{"containerd", "apt-get install containerd"},
	{"containerd-shim-runc-v2", "apt-get install containerd"},
	{"runc", "apt-get install runc"},
	{"buildkitd", "make tools"},
	{"etcd", "make tools"},
	{"kube-apiserver", "make tools"},
	{"git", "apt-get install git"},
	{"iptables", "apt-get install iptables"},      // the tenants' filter rules (internal/tenantnet)
	{"ip6tables", "apt-get install iptables"},     // their IPv6 rule: no IPv6 from a tenant's interface
	{"busybox", "apt-get install busybox-static"}, // with BusyboxBase or LocalBases only
	{"mmdebstrap", "apt-get install mmdebstrap"},  // with LocalBases only
}

// Binaries are the paths of the programs bex up runs.
type Binaries map[string]string

// Preflight checks what bex up needs before it starts anything, and says in one line
// what is missing and the command that brings it. Programs are looked for next to
// the bex binary (bin/ of a source tree, where `make tools` puts them) and then in
// PATH.
func Preflight(cfg Config) (Binaries, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("bex up must run as root: containerd and runc need it (run: sudo %s up ...)", cfg.Bex)
	}
	found := Binaries{}
	var missing, fixes []string
	for _, p := range programs {
		if cfg.ContainerdAddr != "" && strings.HasPrefix(p.name, "containerd") || p.name == "busybox" && !cfg.BusyboxBase && !cfg.LocalBases ||
			p.name == "mmdebstrap" && !cfg.LocalBases {
			continue
		}
		if path, err := lookPath(p.name, filepath.Dir(cfg.Bex)); err == nil {
			found[p.name] = path
			continue
		}
		missing = append(missing, p.name)
		if !slices.Contains(fixes, p.from) {
			fixes = append(fixes, p.from)
		}
	}
	if len(missing) > 0 {
		fix := "run `" + strings.Join(fixes, "` and `") + "`"
		if len(fixes) > 1 || fixes[0] != "make tools" {
			fix += " (or `make tools` in the bex source tree, which installs all of them)"
		} else {
			fix += " in the bex source tree"
		}
		return nil, fmt.Errorf("bex up needs %s, not found next to %s or in PATH: %s", strings.Join(missing, ", "), cfg.Bex, fix)
	}
	return found, nil
}

func lookPath(name, dir string) (string, error) {
	p := filepath.Join(dir, name)
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return p, nil
	}
	return exec.LookPath(name)
}
