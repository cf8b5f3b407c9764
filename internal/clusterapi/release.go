package clusterapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// VersionVar is the variable of hack/versions.env that names the release.
const VersionVar = "CLUSTER_API_VERSION"

// ReleaseVersion reads the release's version (VersionVar) from the versions file
// at path (hack/versions.env).
func ReleaseVersion(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") && k == VersionVar && v != "" {
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s names no %s", path, VersionVar)
}

// Release is one Cluster API release's sources in the module cache.
type Release struct {
	Version string
	CoreDir string // sigs.k8s.io/cluster-api@Version
	TestDir string // sigs.k8s.io/cluster-api/test@Version (CAPD)
}

// DownloadRelease finds the release's two modules in the module cache, downloading
// them (through the module proxy) when they are not there yet.
func DownloadRelease(version string) (Release, error) {
	core, err := DownloadModule("sigs.k8s.io/cluster-api", version)
	if err != nil {
		return Release{}, err
	}
	test, err := DownloadModule("sigs.k8s.io/cluster-api/test", version)
	if err != nil {
		return Release{}, err
	}
	return Release{Version: version, CoreDir: core, TestDir: test}, nil
}

// ModuleDir is the directory of m's module.
func (r Release) ModuleDir(m Manager) string {
	if m.Module == ModuleTest {
		return r.TestDir
	}
	return r.CoreDir
}

// DownloadModule downloads a module into the module cache (through the proxy, or from
// the cache when it is there) and returns its directory.
func DownloadModule(path, version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", path+"@"+version)
	// Outside any module: the download must not touch bex's go.mod.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=on")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	_ = json.Unmarshal(out, &info)
	if err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %v %s", path, version, err, info.Error)
	}
	return info.Dir, nil
}
