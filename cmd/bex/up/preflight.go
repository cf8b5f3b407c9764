package up

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"bex.co/bex/internal/machine/daemons"
)

// The programs bex up runs or needs, and the Debian package or make target that
// brings each.
var programs = []struct{ name, from string }{
	{"containerd", "apt-get install containerd"},
	{"containerd-shim-runc-v2", "apt-get install containerd"},
	{"runc", "make tools"},       // Debian 12's runc lacks the 2025 fixes: CheckRunc
	{"jq", "apt-get install jq"}, // the runc wrapper's rewrite of build steps' specs
	{"buildkitd", "make tools"},
	{"etcd", "make tools"},
	{"kube-apiserver", "make tools"},
	{"git", "apt-get install git"},
	{"iptables", "apt-get install iptables"},      // the tenants' filter rules (internal/machine/tenantnet)
	{"ip6tables", "apt-get install iptables"},     // their IPv6 rule: no IPv6 from a tenant's interface
	{"busybox", "apt-get install busybox-static"}, // with BusyboxBase or LocalBases only
	{"mmdebstrap", "apt-get install mmdebstrap"},  // with LocalBases only
}

// Binaries are the paths of the programs bex up runs.
type Binaries map[string]string

// Preflight checks what bex up needs before it starts anything, and says in one line
// what is missing and the command that brings it. Programs are looked for next to
// the bex binary (bin/ of a source tree, where `make tools` puts them) and then in
// PATH; runc is --runc when given. The runc's version is checked by checkRunc.
func Preflight(cfg Config) (Binaries, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("bex up must run as root: containerd and runc need it (run: sudo %s up ...)", cfg.Bex)
	}
	found := Binaries{}
	var missing, fixes []string
	for _, p := range programs {
		if cfg.ContainerdAddr != "" && (strings.HasPrefix(p.name, "containerd") || p.name == "runc" || p.name == "jq") ||
			p.name == "busybox" && !cfg.BusyboxBase && !cfg.LocalBases ||
			p.name == "mmdebstrap" && !cfg.LocalBases {
			continue
		}
		if p.name == "runc" && cfg.Runc != "" {
			if fi, err := os.Stat(cfg.Runc); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return nil, fmt.Errorf("--runc %s: not an executable file: run `make tools` in the bex source tree (it builds runc into bin/), or give the path of a runc 1.2.8, 1.3.3, 1.4.0 or later", cfg.Runc)
			}
			found[p.name] = cfg.Runc
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

// checkRunc returns the line that says which runc the containers will run
// with, with its version, and refuses one without the 2025 fixes
// (daemons.CheckRunc) in one line that says how to get a newer. With
// --containerd-addr the containers run with that containerd's runc, which bex
// neither chooses nor wraps: the line says so. Start prints the line once it
// holds the state dir's lock, so that a refused second bex up says one line.
func checkRunc(cfg Config, bins Binaries) (string, error) {
	if cfg.ContainerdAddr != "" {
		return fmt.Sprintf("    %-15s the containerd at %s runs containers with its own runc: bex cannot check it has %s, nor confine build steps\n", "runc", cfg.ContainerdAddr, daemons.RuncFixes), nil
	}
	v, err := daemons.CheckRunc(bins["runc"])
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("    %-15s runc %s at %s runs every container (it has the 2025 fixes)\n", "runc", v, bins["runc"]), nil
}
