package infra

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	// The registry binary's auth backend, registered as its main package does.
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"bex.co/bex/internal/testregistry"
)

// TestRegistryCollectsWhatTheDeployerDeletes: infra/bex's registry allows
// deletes, keeps no blob descriptor cache, and its CronJob runs
// `garbage-collect --delete-untagged` on the very volume and configuration the
// registry serves from, on its node. Then the registry's configuration as
// rendered is served for real: an image deleted by digest and collected is off
// the disk, and the same image pushed again after the collection can be pulled
// whole — the cache the configuration leaves out would have answered that its
// blobs exist and let the push skip them.
func TestRegistryCollectsWhatTheDeployerDeletes(t *testing.T) {
	var cm corev1.ConfigMap
	var dep appsv1.Deployment
	var cron batchv1.CronJob
	found := 0
	for _, obj := range objects(t, render(t, "bex")) {
		var into any
		switch {
		case obj.GetKind() == "ConfigMap" && obj.GetName() == "bex-registry":
			into = &cm
		case obj.GetKind() == "Deployment" && obj.GetName() == "bex-registry":
			into = &dep
		case obj.GetKind() == "CronJob" && obj.GetName() == "bex-registry-gc":
			into = &cron
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
			t.Fatal(err)
		}
		found++
	}
	if found != 3 {
		t.Fatalf("found %d of the ConfigMap, Deployment and CronJob bex-registry(-gc)", found)
	}
	conf := cm.Data["config.yml"]
	cfg, err := configuration.Parse(strings.NewReader(conf))
	if err != nil {
		t.Fatalf("the registry's config.yml: %v", err)
	}
	if cfg.Storage.Type() != "filesystem" || cfg.Storage["delete"]["enabled"] != true {
		t.Errorf("storage %v: want the filesystem driver with delete.enabled", cfg.Storage)
	}
	if _, ok := cfg.Storage["cache"]; ok {
		t.Errorf("storage.cache %v: a blob descriptor cache outlives garbage-collect", cfg.Storage["cache"])
	}
	root := fmt.Sprint(cfg.Storage.Parameters()["rootdirectory"])

	server, gc := dep.Spec.Template.Spec, cron.Spec.JobTemplate.Spec.Template.Spec
	sc, gcc := server.Containers[0], gc.Containers[0]
	if got := strings.Join(sc.Args, " "); got != "serve /etc/distribution/config.yml" {
		t.Errorf("the registry runs %q", got)
	}
	if got := strings.Join(gcc.Args, " "); got != "garbage-collect --delete-untagged /etc/distribution/config.yml" {
		t.Errorf("the CronJob runs %q", got)
	}
	if sc.Image != gcc.Image {
		t.Errorf("the CronJob runs %s, the registry %s", gcc.Image, sc.Image)
	}
	// The same claim and ConfigMap, mounted at the same paths, the data where
	// the configuration says.
	mounts := func(spec corev1.PodSpec, c corev1.Container) map[string]string {
		src := map[string]string{}
		for _, v := range spec.Volumes {
			switch {
			case v.PersistentVolumeClaim != nil:
				src[v.Name] = "pvc/" + v.PersistentVolumeClaim.ClaimName
			case v.ConfigMap != nil:
				src[v.Name] = "configmap/" + v.ConfigMap.Name
			case v.Secret != nil:
				src[v.Name] = "secret/" + v.Secret.SecretName
			}
		}
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			out[m.MountPath] = src[m.Name]
		}
		return out
	}
	want := map[string]string{root: "pvc/bex-registry", "/etc/distribution": "configmap/bex-registry"}
	// The server alone checks credentials; garbage-collect reads the disk.
	withAuth := maps.Clone(want)
	withAuth[path.Dir(htpasswdPath(t, cfg))] = "secret/bex-registry-htpasswd"
	if got := mounts(server, sc); fmt.Sprint(got) != fmt.Sprint(withAuth) {
		t.Errorf("the registry mounts %v, want %v", got, withAuth)
	}
	if got := mounts(gc, gcc); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the CronJob mounts %v, want %v", got, want)
	}
	// On the registry's node: a ReadWriteOnce volume attaches to one node.
	aff := gc.Affinity
	if aff == nil || aff.PodAffinity == nil || len(aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("the CronJob's pods have no required pod affinity: %+v", aff)
	}
	term := aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	if term.TopologyKey != "kubernetes.io/hostname" || fmt.Sprint(term.LabelSelector.MatchLabels) != fmt.Sprint(dep.Spec.Template.Labels) {
		t.Errorf("affinity %+v, want the registry pod's labels %v on its host", term, dep.Spec.Template.Labels)
	}
	if cron.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("concurrency policy %q: two collections at once", cron.Spec.ConcurrencyPolicy)
	}

	// The configuration, served: an image pushed again after the collection
	// pulls whole. The control: the same with the image's default cache, which
	// serves the collected blobs as if they were there.
	if err := pushCollectPushPull(t, conf); err != nil {
		t.Errorf("the image pushed again after the collection cannot be pulled: %v", err)
	}
	t.Run("control with the blob descriptor cache", func(t *testing.T) {
		if err := pushCollectPushPull(t, strings.Replace(conf, "storage:\n", "storage:\n  cache: {blobdescriptor: inmemory}\n", 1)); err == nil {
			t.Error("with the cache, the pull of the image pushed again worked: the test would not see the cache's harm")
		}
	})
}

// pushCollectPushPull serves conf, pushes and pulls an image, deletes its
// manifest, collects (checking its layers left the disk), pushes the same image
// again and returns the error of pulling it whole.
func pushCollectPushPull(t *testing.T, conf string) error {
	reg, users := serveWithUsers(t, conf)
	auth := remote.WithAuth(users["builder"])
	img, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	layers, _ := img.Layers()
	tag := func(s string) name.Reference {
		r, err := name.ParseReference(reg.Host + "/apps/shop:" + s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := remote.Write(tag("c1"), img, auth); err != nil {
		t.Fatal(err)
	}
	// A pull first, as a node's would: what the cache would remember.
	pull := func(ref name.Reference) error {
		got, err := remote.Image(ref, auth)
		if err != nil {
			return err
		}
		ls, err := got.Layers()
		if err != nil {
			return err
		}
		for _, l := range ls {
			rc, err := l.Compressed()
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := pull(tag("c1")); err != nil {
		t.Fatal(err)
	}
	digestRef, _ := name.NewDigest(reg.Host + "/apps/shop@" + d.String())
	if err := remote.Delete(digestRef, auth); err != nil {
		t.Fatalf("DELETE the manifest: %v", err)
	}
	reg.GarbageCollect(t)
	for _, l := range layers {
		ld, _ := l.Digest()
		if reg.HasBlob(t, ld.String()) {
			t.Errorf("layer %s still on disk after the collection", ld)
		}
	}
	if err := remote.Write(tag("c2"), img, auth); err != nil {
		t.Fatal(err)
	}
	return pull(tag("c2"))
}

// htpasswdPath is where the registry's configuration reads its htpasswd file.
func htpasswdPath(t *testing.T, cfg *configuration.Configuration) string {
	t.Helper()
	if cfg.Auth.Type() != "htpasswd" {
		t.Fatalf("the registry's auth is %q, want htpasswd: without it any pod reads, pushes and deletes every app's images", cfg.Auth.Type())
	}
	p, _ := cfg.Auth.Parameters()["path"].(string)
	if p == "" {
		t.Fatal("auth.htpasswd has no path")
	}
	return p
}

// serveWithUsers serves conf with its htpasswd path moved to a file of the
// users hack/install-bex.sh makes (bcrypt, as hack/htpasswd writes them), and
// returns their credentials.
func serveWithUsers(t *testing.T, conf string) (*testregistry.Registry, map[string]authn.Authenticator) {
	t.Helper()
	cfg, err := configuration.Parse(strings.NewReader(conf))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "htpasswd")
	users := map[string]authn.Authenticator{}
	var lines []string
	for _, u := range []string{"builder", "deployer", "node"} {
		pw := u + "-password-of-this-test"
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, u+":"+string(h))
		users[u] = &authn.Basic{Username: u, Password: pw}
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return testregistry.StartConfig(t, strings.Replace(conf, htpasswdPath(t, cfg), file, 1)), users
}

// TestRegistryRequiresCredentials: infra/bex's registry, as rendered, answers
// 401 to every request without valid credentials (listing, reading a manifest
// or a layer, pushing, deleting: what an app's pod would try), and its users
// each reach it. The components that use it carry the credentials of the
// Secrets hack/install-bex.sh makes, mounted where their --registry-config
// reads; no other pod mounts them.
func TestRegistryRequiresCredentials(t *testing.T) {
	var conf string
	var deployments []appsv1.Deployment
	var sets []appsv1.StatefulSet
	for _, obj := range objects(t, render(t, "bex")) {
		switch obj.GetKind() {
		case "ConfigMap":
			if obj.GetName() == "bex-registry" {
				conf, _, _ = unstructuredString(obj.Object, "data", "config.yml")
			}
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &d); err != nil {
				t.Fatal(err)
			}
			deployments = append(deployments, d)
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &s); err != nil {
				t.Fatal(err)
			}
			sets = append(sets, s)
		}
	}
	reg, users := serveWithUsers(t, conf)
	img, err := random.Image(4<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(reg.Host + "/apps/shop:c1")
	if err := remote.Write(ref, img, remote.WithAuth(users["builder"])); err != nil {
		t.Fatalf("builder pushes: %v", err)
	}
	d, _ := img.Digest()
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	base := "http://" + reg.Host + "/v2/"
	for _, r := range []struct{ method, url string }{
		{"GET", base},
		{"GET", base + "_catalog"},
		{"GET", base + "apps/shop/manifests/c1"},
		{"GET", base + "apps/shop/blobs/" + ld.String()},
		{"POST", base + "apps/intruder/blobs/uploads/"},
		{"DELETE", base + "apps/shop/manifests/" + d.String()},
	} {
		for _, who := range []string{"nobody", "a wrong password"} {
			req, _ := http.NewRequest(r.method, r.url, nil)
			if who != "nobody" {
				req.SetBasicAuth("builder", "not-the-password")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: %d, want 401", r.method, r.url, who, resp.StatusCode)
			}
		}
	}
	// The control: each user reads the image (the nodes pull as node, the
	// deployer deletes as deployer), and the image is still there, so the 401s
	// above were refusals, not absences.
	for _, u := range []string{"builder", "deployer", "node"} {
		if _, err := remote.Image(ref, remote.WithAuth(users[u])); err != nil {
			t.Errorf("%s cannot pull: %v", u, err)
		}
	}
	dr, _ := name.NewDigest(reg.Host + "/apps/shop@" + d.String())
	if err := remote.Delete(dr, remote.WithAuth(users["deployer"])); err != nil {
		t.Errorf("deployer cannot delete: %v", err)
	}

	// Who mounts which credentials, and reads them where.
	want := map[string]string{"bex-gitserver": "bex-registry-builder", "bex-deployer": "bex-registry-deployer"}
	check := func(kind, name string, spec corev1.PodSpec) {
		secrets := map[string]string{}
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				secrets[v.Name] = v.Secret.SecretName
			}
		}
		var mounted []string
		for _, c := range spec.Containers {
			for _, m := range c.VolumeMounts {
				s := secrets[m.Name]
				if !strings.HasPrefix(s, "bex-registry-") {
					continue
				}
				mounted = append(mounted, s)
				if s == want[name] && !containsArg(c.Args, "--registry-config="+m.MountPath+"/config.json") {
					t.Errorf("%s %s mounts %s at %s but its args %v do not read it", kind, name, s, m.MountPath, c.Args)
				}
			}
		}
		switch {
		case want[name] != "" && (len(mounted) != 1 || mounted[0] != want[name]):
			t.Errorf("%s %s mounts %v, want [%s]", kind, name, mounted, want[name])
		case want[name] == "" && name != "bex-registry" && len(mounted) > 0:
			t.Errorf("%s %s mounts the registry's credentials %v", kind, name, mounted)
		}
	}
	for _, d := range deployments {
		check("Deployment", d.Name, d.Spec.Template.Spec)
	}
	for _, s := range sets {
		check("StatefulSet", s.Name, s.Spec.Template.Spec)
	}
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
