package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// TestDeployImageOnACluster is deploy:image with the gitserver as a cluster
// runs it (--runtime kubernetes --push, infra/bex's flags), over the real ssh
// and the real API server, with the deployer's part played by FakeDeployer: the
// image of a private registry is refused before registry:login, saying so, and
// after it is copied into the platform's registry (distribution's, on
// loopback) under the app's repository; the App runs it from there, pinned by
// the digest the source had, as a release of cause Image. A missing image is
// refused naming it.
func TestDeployImageOnACluster(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	own := testregistry.Start(t, true)
	priv := testregistry.StartPrivate(t, "ci", "s3cret-pw")
	bin, err := testenv.Binary("busybox")
	if err != nil {
		t.Fatal(err)
	}
	src := testregistry.Push(t, priv.Host+"/team/web:v1", testregistry.ServingImage(t, bin, "cluster\n"), "ci", "s3cret-pw")
	digest := src[strings.Index(src, "@")+1:]

	e := startHooksEnv(t, ctx, "--runtime", "kubernetes", "--push", "--image-repo", own.Host+"/apps", "--registry-insecure",
		"--allow-private-registries")
	testenv.StartFakeDeployer(ctx, t, e.cp.Client, e.ns)
	e.ssh("apps:create", "capp")

	try := func(stdin string, args ...string) (string, error) {
		cmd := testenv.SSHCommand(e.admin, "bex", e.sshAddr, args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := try("", "deploy:image", "capp", priv.Host+"/team/web:v1"); err == nil || !strings.Contains(out, priv.Host+" needs a login to pull "+priv.Host+"/team/web:v1") {
		t.Fatalf("before registry:login: %v\n%s", err, out)
	}
	if out, err := try("", "deploy:image", "capp", priv.Host+"/team/web:v9"); err == nil || !strings.Contains(out, priv.Host+"/team/web:v9") {
		t.Fatalf("a missing tag: %v\n%s", err, out)
	}
	if out, err := try("s3cret-pw\n", "registry:login", priv.Host, "ci", "--password-stdin"); err != nil {
		t.Fatalf("registry:login: %v\n%s", err, out)
	}
	out, err := try("", "deploy:image", "capp", priv.Host+"/team/web:v1")
	if err != nil || !strings.Contains(out, "v1 serves at https://capp.localhost") {
		t.Fatalf("deploy:image after registry:login: %v\n%s", err, out)
	}

	app := &appv1.App{}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "capp"}, app); err != nil {
		t.Fatal(err)
	}
	if app.Spec.Image != own.Host+"/apps/capp@"+digest {
		t.Fatalf("spec.image %s, want the platform registry's copy of %s", app.Spec.Image, src)
	}
	if rel := e.release("capp", 1); rel == nil || rel.Spec.Cause != appv1.ReleaseCauseImage {
		t.Fatalf("release v1: %+v", rel)
	}
	// The nodes pull the copy from the platform's registry without the
	// source's credentials.
	ref, err := name.ParseReference(app.Spec.Image, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if desc, err := remote.Get(ref, remote.WithAuth(authn.Anonymous)); err != nil || desc.Digest.String() != digest {
		t.Fatalf("the copy in the platform's registry: %v %v", desc, err)
	}
	if strings.Contains(e.stderr.String(), "s3cret-pw") {
		t.Errorf("the password is in the gitserver's log")
	}
}
