package builder_test

import (
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"bex.co/bex/builder"
	"bex.co/bex/internal/testenv"
)

// TestPushToARegistryWithCredentials is the cluster mode: the image goes to a
// registry (go-containerregistry's, on loopback, behind basic auth) instead of staying
// in containerd, and the credentials come from a Docker-style config file.
func TestPushToARegistryWithCredentials(t *testing.T) {
	reg := httptest.NewServer(basicAuth("bex", "s3cret", registry.New(registry.Logger(log.New(io.Discard, "", 0)))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")

	// A private containerd and buildkitd, the latter told that this registry speaks
	// plain HTTP.
	dir := t.TempDir()
	c, err := testenv.StartContainerd(filepath.Join(dir, "containerd"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	bk, err := testenv.StartBuildkitd(filepath.Join(dir, "buildkitd"), c, testenv.WithHTTPRegistry(host))
	if err != nil {
		t.Fatal(err)
	}
	defer bk.Stop()

	writeConfig := func(user, pass string) string {
		p := filepath.Join(t.TempDir(), "config.json")
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		os.WriteFile(p, []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)), 0o600)
		return p
	}
	newB := func(configPath string) *builder.Builder {
		cfg := builder.DefaultConfig()
		cfg.StateDir = t.TempDir()
		cfg.Address = bk.Address
		cfg.ImageRepo = host + "/apps"
		cfg.Push = true
		cfg.RegistryConfig = configPath
		b, err := builder.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	r := newRepo(t, map[string]string{"Dockerfile": "FROM scratch\nCOPY app.txt /app.txt\n", "app.txt": "pushed\n"})

	res, out := mustBuild(t, newB(writeConfig("bex", "s3cret")), r.request("web"))
	if !strings.HasPrefix(res.Image, host+"/apps/web@sha256:") {
		t.Fatalf("image %s", res.Image)
	}
	ref, err := name.ParseReference(res.Image, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref, remote.WithAuth(&authn.Basic{Username: "bex", Password: "s3cret"}))
	if err != nil {
		t.Fatalf("the pushed image is not in the registry: %v\n%s", err, out)
	}
	if desc.Digest.String() != strings.SplitN(res.Image, "@", 2)[1] {
		t.Fatalf("registry has %s, the build reported %s", desc.Digest, res.Image)
	}

	r.commit(map[string]string{"app.txt": "again\n"})
	_, out, err = build(t, newB(writeConfig("bex", "wrong")), r.request("web"))
	if err == nil || !strings.Contains(err.Error(), "the registry refused the push (unauthorized)") {
		t.Fatalf("wrong credentials: %v\n%s", err, out)
	}
}

func basicAuth(user, pass string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
