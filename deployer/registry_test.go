package deployer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// On a cluster: the real reconciler with the kubernetes runtime configured as
// infra/bex configures bex deployer (--image-repo naming the registry,
// --registry-delete) and a real distribution registry. The manifests of pruned
// releases are deleted from the registry (a kept release's digest stays, even
// when a pruned one has it too), and when the App is deleted every manifest of
// its repository goes, a build that was never released included; another
// app's repository is untouched. The registry's garbage collection then frees
// the app's blobs.
func TestRegistryImagesFollowReleasesAndApps(t *testing.T) {
	reg := testregistry.Start(t, true)
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "kube-images")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Controller: controllerConfig(),
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := kube.New(kube.Config{RegistryDelete: true, RegistryInsecure: true}, mgr.GetClient())
	if err != nil {
		t.Fatal(err)
	}
	cfg := kubeConfig()
	cfg.KeepReleases, cfg.ImageRepo = 2, reg.Host+"/apps"
	if err := (&AppReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Runtime: rt, Config: cfg}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	push := func(repo, tag string, img v1.Image) string {
		t.Helper()
		ref, err := name.NewTag(repo + ":" + tag)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		return repo + "@" + d.String()
	}
	img := func() v1.Image {
		i, err := random.Image(32<<10, 1)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	exists := func(ref string) bool {
		t.Helper()
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		_, err = remote.Head(r)
		if err != nil && !is404(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	repo := reg.Host + "/apps/shop"
	other := push(reg.Host+"/apps/shop-2", "c1", img())
	if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	rec := &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	again := img()
	refs := []string{push(repo, "c1", img()), push(repo, "c2", again), push(repo, "c3", img()), push(repo, "c4", again)}
	for _, ref := range refs {
		if _, err := rec.Record(ctx, "shop", releases.Change{Image: ref, Cause: appv1.ReleaseCausePush, Processes: map[string][]string{"web": nil}}); err != nil {
			t.Fatal(err)
		}
	}
	unreleased := push(repo, "c5", img())
	// Releases 1 and 2 are pruned (2 kept: 3 and 4). Release 1's manifest is
	// deleted; release 2's digest is release 4's too, and stays.
	testenv.Eventually(t, 20*time.Second, "release 1's manifest deleted", func() error {
		if exists(refs[0]) {
			return fmt.Errorf("%s still in the registry", refs[0])
		}
		return nil
	})
	testenv.Eventually(t, 20*time.Second, "two releases left", func() error {
		rels, err := rec.List(ctx, "shop")
		if err != nil || len(rels) != 2 {
			return fmt.Errorf("%d releases, %v", len(rels), err)
		}
		return nil
	})
	for _, ref := range []string{refs[1], refs[2], refs[3], unreleased, other} {
		if !exists(ref) {
			t.Errorf("%s was deleted while a kept release or another app uses it", ref)
		}
	}

	app := &appv1.App{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop"}, app); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, app); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the App is gone", func() error {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop"}, &appv1.App{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	for _, ref := range append(refs, unreleased) {
		if exists(ref) {
			t.Errorf("%s is still in the registry after the app was deleted", ref)
		}
	}
	if !exists(other) {
		t.Errorf("the other app's image %s was deleted", other)
	}
	before := reg.BlobBytes(t)
	reg.GarbageCollect(t)
	t.Logf("registry blobs: %d bytes before the collection, %d after (the other app's image is left)", before, reg.BlobBytes(t))
}

// is404 reports the registry's 404: the manifest is not there.
func is404(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
