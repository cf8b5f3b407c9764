package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"bex.co/bex/internal/clusterapi"
)

// capdDebugPort is where CAPD's manager serves its in-memory backend's debug
// server, on every address, whichever backend is used; no flag moves it.
const capdDebugPort = 19000

// binaries are the programs of bin/ that serve runs, by name.
func binaries(root string) (map[string]string, error) {
	names := []string{"etcd", "kube-apiserver", "kubectl"}
	for _, m := range clusterapi.Managers() {
		names = append(names, m.Name)
	}
	out := map[string]string{}
	for _, n := range names {
		p := filepath.Join(root, "bin", n)
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("bin/%s is missing: run make tools", n)
		}
		out[n] = p
	}
	return out, nil
}

// preflight checks what serve needs besides bin/, so that up says what is missing
// before it starts anything.
func preflight(root string) (map[string]string, error) {
	bins, err := binaries(root)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		return nil, fmt.Errorf("setpriv is missing: install util-linux (etcd and kube-apiserver get their parent-death signal through it)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		return nil, fmt.Errorf("go is missing from PATH: the Cluster API release's CRDs and webhooks come from the Go module cache")
	}
	return bins, debugPortFree()
}

// debugPortFree: CAPD's manager can listen on its debug port.
func debugPortFree() error {
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", capdDebugPort))
	if err == nil {
		l.Close()
		return nil
	}
	var dirs []string
	for _, p := range serves() {
		dirs = append(dirs, p.args[2])
	}
	if len(dirs) > 0 {
		return fmt.Errorf("port %d is taken by the management plane of %s (CAPD's manager listens there, so one runs per machine): stop it first (capdmgmt down %s)", capdDebugPort, strings.Join(dirs, " and "), dirs[0])
	}
	return fmt.Errorf("port %d is taken (ss -ltnp 'sport = :%d' names the program): CAPD's manager listens there; stop that program first", capdDebugPort, capdDebugPort)
}
