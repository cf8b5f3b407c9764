package infra

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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
			}
		}
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			out[m.MountPath] = src[m.Name]
		}
		return out
	}
	want := map[string]string{root: "pvc/bex-registry", "/etc/distribution": "configmap/bex-registry"}
	if got := mounts(server, sc); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the registry mounts %v, want %v", got, want)
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
	reg := testregistry.StartConfig(t, conf)
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
	if err := remote.Write(tag("c1"), img); err != nil {
		t.Fatal(err)
	}
	// A pull first, as a node's would: what the cache would remember.
	pull := func(ref name.Reference) error {
		got, err := remote.Image(ref)
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
	if err := remote.Delete(digestRef); err != nil {
		t.Fatalf("DELETE the manifest: %v", err)
	}
	reg.GarbageCollect(t)
	for _, l := range layers {
		ld, _ := l.Digest()
		if reg.HasBlob(t, ld.String()) {
			t.Errorf("layer %s still on disk after the collection", ld)
		}
	}
	if err := remote.Write(tag("c2"), img); err != nil {
		t.Fatal(err)
	}
	return pull(tag("c2"))
}
