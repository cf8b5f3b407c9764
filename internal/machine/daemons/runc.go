package daemons

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// RuncFixes names what a runc must have to run tenants: the November 2025 fixes of
// container escapes through /dev/null and /dev/console masking and /proc writes
// (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881), released in runc 1.2.8, 1.3.3
// and 1.4.0. Debian 12's runc 1.1.5 has none of them.
const RuncFixes = "the November 2025 fixes (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881; runc 1.2.8, 1.3.3, 1.4.0 and later)"

// RuncVersion runs `PATH --version` and returns the version it states, e.g. "1.5.3"
// or "1.1.5+ds1".
func RuncVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "runc version "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s --version says no \"runc version\": is it runc?", path)
}

// RuncFixed reports whether a runc of this version (as RuncVersion gives it) has
// RuncFixes. A pre-release counts as older than its release.
func RuncFixed(version string) bool {
	core, pre, _ := strings.Cut(version, "-")
	core, _, _ = strings.Cut(core, "+")
	parts := strings.Split(core, ".")
	if len(parts) < 3 {
		return false
	}
	var n [3]int
	for i := range n {
		v, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		n[i] = v
	}
	first := map[[2]int]int{{1, 2}: 8, {1, 3}: 3, {1, 4}: 0}
	switch {
	case n[0] != 1:
		return n[0] > 1
	case n[1] > 4:
		return true
	}
	p, ok := first[[2]int{n[0], n[1]}]
	if !ok {
		return false // 1.0, 1.1: no fix was released for them
	}
	return n[2] > p || n[2] == p && pre == ""
}

// CheckRunc returns the version of the runc at path, or an error of one line that
// says how to get one with RuncFixes when it is older.
func CheckRunc(path string) (string, error) {
	v, err := RuncVersion(path)
	if err != nil {
		return "", err
	}
	if !RuncFixed(v) {
		return v, fmt.Errorf("runc %s at %s lacks %s: run `make tools` in the bex source tree (it builds runc into bin/), or pass --runc with a newer one", v, path, RuncFixes)
	}
	return v, nil
}
