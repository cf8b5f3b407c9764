package gitserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/pipeline"
)

// fakeImages "pulls" every reference but one into the app's repository.
type fakeImages struct{ asked []string }

func (f *fakeImages) Import(_ context.Context, app, ref string, progress io.Writer) (string, error) {
	f.asked = append(f.asked, app+" "+ref)
	if strings.HasSuffix(ref, ":nope") {
		return "", &backend.Error{Kind: backend.NotFound, Msg: ref + " does not exist in registry.test: check the name and the tag"}
	}
	fmt.Fprintf(progress, "-----> Resolved %s to registry.test/x@sha256:%s\n", ref, strings.Repeat("b", 64))
	return "bex.local/" + app + "@sha256:" + strings.Repeat("b", 64), nil
}

// TestDeployImageReleasesAsAPushDoes: deploy:image's pipeline is a push's
// without the build: progress lines, a release of cause Image whose process
// types are the image's own command as web, the rollout awaited, and a failed
// pull or rollout reported with the previous release serving.
func TestDeployImageReleasesAsAPushDoes(t *testing.T) {
	images := &fakeImages{}
	e := newEnv(t)
	e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("shop")
	ctx := context.Background()

	var progress bytes.Buffer
	res, err := e.pl.DeployImage(ctx, pipeline.ImageRequest{App: "shop", Image: "registry.test/x:v1", Actor: "ana"}, images, &progress)
	if err != nil || res.Release != 1 || res.URL != "https://shop.bex.test" {
		t.Fatalf("DeployImage: %+v %v\n%s", res, err, progress.String())
	}
	for _, want := range []string{"-----> Pulling registry.test/x:v1", "-----> Resolved registry.test/x:v1", "-----> Releasing bex.local/shop@sha256:",
		"-----> Deploying release v1", "       web.1 started", "-----> Application deployed: release v1"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("no %q in:\n%s", want, progress.String())
		}
	}
	rels := e.releaser.all()
	if len(rels) != 1 {
		t.Fatalf("releases %+v", rels)
	}
	r := rels[0]
	if r.Cause != pipeline.CauseImage || r.Image != "bex.local/shop@sha256:"+strings.Repeat("b", 64) || r.Commit != "" ||
		r.Description != "Deploy image registry.test/x:v1" || r.Processes == nil || len(r.Processes) != 0 || r.Release != nil || r.AppJSON != nil {
		t.Errorf("release %+v", r)
	}
	if len(e.builder.all()) != 0 {
		t.Errorf("deploy:image built something")
	}

	// A missing image: its error, as the importer said it, and no release.
	progress.Reset()
	_, err = e.pl.DeployImage(ctx, pipeline.ImageRequest{App: "shop", Image: "registry.test/x:nope", Actor: "ana"}, images, &progress)
	if backend.KindOf(err) != backend.NotFound || !strings.Contains(err.Error(), "registry.test/x:nope does not exist") ||
		!strings.Contains(progress.String(), "Nothing changed on shop: release v1 keeps serving.") {
		t.Errorf("a missing image: %v\n%s", err, progress.String())
	}
	// A rollout that fails: Failed, saying why.
	e.releaser.mu.Lock()
	e.releaser.fail = func(string, int64) error { return errors.New("web.1 did not answer GET /") }
	e.releaser.mu.Unlock()
	_, err = e.pl.DeployImage(ctx, pipeline.ImageRequest{App: "shop", Image: "registry.test/x:v2", Actor: "ana"}, images, nil)
	if backend.KindOf(err) != backend.Failed || !strings.Contains(err.Error(), "web.1 did not answer GET /") {
		t.Errorf("a failed rollout: %v", err)
	}
	if n := len(e.releaser.all()); n != 2 {
		t.Errorf("%d releases, want 2 (the missing image made none)", n)
	}
	var ks backend.KeepsServing
	if !errors.As(err, &ks) || ks.KeepsServing() != 0 {
		t.Errorf("a failed rollout whose reason names no release serving: %v", err)
	}
	// The deployer's reason names the release that serves on: the error says
	// which, as data (the backend then does not say it again).
	e.releaser.mu.Lock()
	e.releaser.fail = func(string, int64) error { return servingOn{1} }
	e.releaser.mu.Unlock()
	_, err = e.pl.DeployImage(ctx, pipeline.ImageRequest{App: "shop", Image: "registry.test/x:v3", Actor: "ana"}, images, nil)
	if !errors.As(err, &ks) || ks.KeepsServing() != 1 || backend.KindOf(err) != backend.Failed ||
		!strings.Contains(err.Error(), "web.1 keeps exiting. Release v1 keeps serving.") {
		t.Errorf("a failed rollout, release v1 serving on: %v", err)
	}

	// No such app; a server without an importer.
	if _, err := e.pl.DeployImage(ctx, pipeline.ImageRequest{App: "nope", Image: "registry.test/x:v1"}, images, nil); !errors.Is(err, pipeline.ErrAppNotFound) {
		t.Errorf("no app: %v", err)
	}
	off := newEnv(t)
	off.createApp("shop")
	if _, err := off.pl.DeployImage(ctx, pipeline.ImageRequest{App: "shop", Image: "registry.test/x:v1"}, nil, nil); !errors.Is(err, pipeline.ErrNoImages) {
		t.Errorf("no importer: %v", err)
	}
}

// servingOn is a rollout's failure as the deployer's release recorder gives
// it, naming the release that serves on.
type servingOn struct{ n int64 }

func (s servingOn) Error() string {
	return fmt.Sprintf("rollout failed: web.1 keeps exiting. Release v%d keeps serving.", s.n)
}
func (s servingOn) KeepsServing() int64 { return s.n }
