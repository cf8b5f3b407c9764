package backend_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/hooksecrets"
)

// fakeImages is the pipeline's DeployImage and the importer's CheckLogin.
type fakeImages struct {
	asked []backend.ImageRequest
	err   error
	// password is the one CheckLogin takes.
	password string
}

func (f *fakeImages) DeployImage(_ context.Context, req backend.ImageRequest) (*backend.DeployResult, error) {
	f.asked = append(f.asked, req)
	if f.err != nil {
		return nil, f.err
	}
	return &backend.DeployResult{Release: 4, URL: "https://" + req.App + ".bex.test"}, nil
}

func (f *fakeImages) CheckLogin(_ context.Context, host, user, password string) error {
	if password != f.password {
		return &backend.Error{Kind: backend.Invalid, Msg: host + " refused the password of " + user}
	}
	return nil
}

func TestDeployImageRules(t *testing.T) {
	ctx := context.Background()
	images := &fakeImages{}
	f := newFixtureWith(t, func(c *backend.Config) { c.Images = images }, deployed(app("shop", "bob")))

	res, err := f.b.DeployImage(ctx, member, "shop", " ghcr.io/org/shop:v1 ", nil)
	if err != nil || res.Release != 4 {
		t.Fatalf("a member's deploy:image: %+v %v", res, err)
	}
	if len(images.asked) != 1 || images.asked[0] != (backend.ImageRequest{App: "shop", Image: "ghcr.io/org/shop:v1", Actor: "bob"}) {
		t.Fatalf("asked %+v", images.asked)
	}
	if !strings.Contains(f.log.String(), "command=deploy:image") || !strings.Contains(f.log.String(), "image=ghcr.io/org/shop:v1") {
		t.Errorf("no audit line:\n%s", f.log.String())
	}
	for _, c := range []struct {
		u     *backend.User
		app   string
		image string
		kind  backend.Kind
	}{
		{guest, "shop", "ghcr.io/org/shop:v1", backend.Forbidden},
		{admin, "nope", "ghcr.io/org/shop:v1", backend.NotFound},
		{member, "shop", "", backend.Invalid},
		{member, "shop", strings.Repeat("a", 513), backend.Invalid},
	} {
		if _, err := f.b.DeployImage(ctx, c.u, c.app, c.image, nil); backend.KindOf(err) != c.kind {
			t.Errorf("%s deploy:image %s %q: %v, want %s", c.u.Name, c.app, c.image, err, c.kind)
		}
	}
	if len(images.asked) != 1 {
		t.Errorf("refusals reached the deployer: %+v", images.asked)
	}

	// The gitserver's kinds pass through, with what to do.
	images.err = &backend.Error{Kind: backend.Failed, Msg: "release v5 did not serve"}
	if _, err := f.b.DeployImage(ctx, member, "shop", "ghcr.io/org/shop:v2", nil); backend.KindOf(err) != backend.Failed ||
		!strings.Contains(err.Error(), "the previous release keeps serving") {
		t.Errorf("a failed rollout: %v", err)
	}
	// A failure whose deployer's reason names the release serving on
	// (KeepsServing, as data): passed on as it is, not said twice.
	images.err = servingOn{&backend.Error{Kind: backend.Failed, Msg: "deploy failed: release v5 did not serve: rollout failed: web.1 keeps exiting. Release v4 keeps serving."}}
	if _, err := f.b.DeployImage(ctx, member, "shop", "ghcr.io/org/shop:v2", nil); backend.KindOf(err) != backend.Failed ||
		err.Error() != images.err.Error() {
		t.Errorf("a failed rollout, v4 serving on: %v", err)
	}
	images.err = &backend.Error{Kind: backend.NotFound, Msg: "ghcr.io/org/shop:v9 does not exist in ghcr.io: check the name and the tag"}
	if _, err := f.b.DeployImage(ctx, member, "shop", "ghcr.io/org/shop:v9", nil); backend.KindOf(err) != backend.NotFound ||
		!strings.Contains(err.Error(), "ghcr.io/org/shop:v9 does not exist") {
		t.Errorf("a missing image: %v", err)
	}

	// Without an importer: one line saying so.
	off := newFixture(t, deployed(app("shop", "bob")))
	if _, err := off.b.DeployImage(ctx, member, "shop", "ghcr.io/org/shop:v1", nil); backend.KindOf(err) != backend.Invalid ||
		!strings.Contains(err.Error(), "does not deploy images") {
		t.Errorf("no importer: %v", err)
	}
}

func TestRegistryLoginKeepsADockerConfigSecret(t *testing.T) {
	ctx := context.Background()
	images := &fakeImages{password: "tok-3n"}
	f := newFixtureWith(t, func(c *backend.Config) { c.Registries = images; c.SecretsNamespace = "bex-secrets" })

	// Admins only; bad input refused before the registry is asked.
	if _, err := f.b.RegistryLogin(ctx, member, "ghcr.io", "ci", "tok-3n"); !errors.Is(err, backend.ErrForbidden) {
		t.Errorf("a member's registry:login: %v", err)
	}
	for _, c := range [][3]string{
		{"https://ghcr.io", "ci", "tok-3n"},
		{"ghcr.io/org", "ci", "tok-3n"},
		{"ghcr.io", "", "tok-3n"},
		{"ghcr.io", "c:i", "tok-3n"},
		{"ghcr.io", "ci", ""},
		{"ghcr.io", "ci", "two\nlines"},
	} {
		if _, err := f.b.RegistryLogin(ctx, admin, c[0], c[1], c[2]); backend.KindOf(err) != backend.Invalid {
			t.Errorf("registry:login %q %q: %v", c[0], c[1], err)
		}
	}
	// A password the registry refuses is not kept.
	if _, err := f.b.RegistryLogin(ctx, admin, "ghcr.io", "ci", "wrong"); backend.KindOf(err) != backend.Invalid || strings.Contains(err.Error(), "wrong") {
		t.Errorf("a refused password: %v", err)
	}
	secret := &corev1.Secret{}
	key := client.ObjectKey{Namespace: "bex-secrets", Name: hooksecrets.RegistryLoginsName}
	if err := f.c.Get(ctx, key, secret); err == nil {
		t.Fatalf("a refused login was kept: %v", secret.Data)
	}

	out, err := f.b.RegistryLogin(ctx, admin, "docker.io", "ci", "tok-3n")
	if err != nil || out.Host != "index.docker.io" || len(out.Logins) != 1 || out.Logins[0].Username != "ci" {
		t.Fatalf("registry:login docker.io: %+v %v", out, err)
	}
	if _, err := f.b.RegistryLogin(ctx, admin, "registry.example:5000", "bot", "tok-3n"); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	if secret.Type != corev1.SecretTypeDockerConfigJson {
		t.Errorf("type %s", secret.Type)
	}
	var cfg struct {
		Auths map[string]struct{ Username, Password, Auth string } `json:"auths"`
	}
	if err := json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &cfg); err != nil || cfg.Auths["index.docker.io"].Auth != "Y2k6dG9rLTNu" ||
		cfg.Auths["registry.example:5000"].Username != "bot" {
		t.Errorf("the Secret holds %v (%v)", cfg, err)
	}
	// The importer reads them back, under Docker Hub's other names too.
	store := &hooksecrets.Registries{Client: f.c, Namespace: "bex-secrets"}
	if u, p, ok, err := store.Registry(ctx, "index.docker.io"); err != nil || !ok || u != "ci" || p != "tok-3n" {
		t.Errorf("Registry(index.docker.io): %q %q %v %v", u, p, ok, err)
	}
	if _, _, ok, _ := store.Registry(ctx, "ghcr.io"); ok {
		t.Errorf("a login for ghcr.io that was never kept")
	}
	if strings.Contains(f.log.String(), "tok-3n") || strings.Contains(f.log.String(), "wrong") {
		t.Errorf("a password in the log:\n%s", f.log.String())
	}
	if !strings.Contains(f.log.String(), "command=registry:login") {
		t.Errorf("no audit line:\n%s", f.log.String())
	}

	list, err := f.b.Registries(ctx, admin)
	if err != nil || len(list.Logins) != 2 || list.Logins[0].Host != "index.docker.io" {
		t.Errorf("registry: %+v %v", list, err)
	}
	if _, err := f.b.RegistryLogout(ctx, member, "docker.io"); !errors.Is(err, backend.ErrForbidden) {
		t.Errorf("a member's registry:logout: %v", err)
	}
	if out, err := f.b.RegistryLogout(ctx, admin, "docker.io"); err != nil || len(out.Logins) != 1 {
		t.Errorf("registry:logout: %+v %v", out, err)
	}
	if _, err := f.b.RegistryLogout(ctx, admin, "docker.io"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("registry:logout twice: %v", err)
	}
	if _, _, ok, _ := store.Registry(ctx, "index.docker.io"); ok {
		t.Errorf("the login is still kept after registry:logout")
	}
}

// servingOn is a deploy's failure that names the release serving on, as the
// pipeline's is when the deployer's reason does.
type servingOn struct{ err *backend.Error }

func (s servingOn) Error() string     { return s.err.Error() }
func (s servingOn) Unwrap() error     { return s.err }
func (servingOn) KeepsServing() int64 { return 4 }
