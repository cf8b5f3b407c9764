package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"bex.co/bex/gitserver/hooksecrets"
)

// ImageDeployer deploys an image from a registry as a release of an app,
// through a push's lock, release and rollout (gitserver/pipeline's DeployImage;
// cmd/bex wires it). Its errors carry kinds: NotFound (no app, or no such
// image), Invalid (not a reference, a registry out of reach or refusing,
// no login), Conflict (a push or deploy holds the app), Failed (the rollout
// failed; the previous release keeps serving).
type ImageDeployer interface {
	DeployImage(ctx context.Context, req ImageRequest) (*DeployResult, error)
}

// ImageRequest is one deploy:image.
type ImageRequest struct {
	App, Image, Actor string
	// Progress receives the pull's and the rollout's lines, as a push's.
	Progress io.Writer
}

// RegistryChecker tries a registry login before it is kept (the image
// importer's CheckLogin). Its errors: Invalid when the registry refuses the
// login or is out of reach, saying which.
type RegistryChecker interface {
	CheckLogin(ctx context.Context, host, username, password string) error
}

// DeployImage deploys image (a tag or digest reference, from any registry this
// server may reach) as a release of app, cause Image, and returns once it
// serves, or why it does not (the previous release keeps serving). Who may:
// whoever may push to app.
func (b *Backend) DeployImage(ctx context.Context, u *User, app, image string, progress io.Writer) (*DeployResult, error) {
	if err := u.mayChange("deploy:image"); err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, app)
	if err != nil {
		return nil, err
	}
	image = strings.TrimSpace(image)
	if image == "" || len(image) > 512 {
		return nil, Errorf(Invalid, "give an image reference as docker pull takes it, e.g. deploy:image %s ghcr.io/org/app:v1", app)
	}
	if b.cfg.Images == nil {
		return nil, Errorf(Invalid, "this server does not deploy images from registries")
	}
	if err := wouldChange(ctx, func(p *Plan) {
		p.Image, p.Release, p.ServingRelease = image, b.nextRelease(ctx, a), a.Status.Revision
		p.Changes = append(p.Changes, fmt.Sprintf("would pull %s, pin it by its digest and roll it out as release v%d running its own command as web; v%d would keep serving until its instances are healthy", image, p.Release, a.Status.Revision))
	}); err != nil {
		return nil, err
	}
	res, err := b.cfg.Images.DeployImage(ctx, ImageRequest{App: app, Image: image, Actor: u.Name, Progress: progress})
	b.audit(u, "deploy:image", app, append(deployAttrs(a, "", res, err), "image", image)...)
	switch KindOf(err) {
	case Conflict:
		return nil, Errorf(Conflict, "%w: try again once it ends", err)
	case Failed:
		var ks KeepsServing
		if errors.As(err, &ks) && ks.KeepsServing() > 0 {
			// The deployer's reason says so already.
			return nil, err
		}
		return nil, Errorf(Failed, "%w; the previous release keeps serving", err)
	}
	return res, err
}

// RegistryLogins is registry:login's and registry:logout's answer.
type RegistryLogins struct {
	// Host is the registry the command was about, as kept (docker.io is
	// index.docker.io).
	Host string `json:"host,omitempty"`
	// Logins are every kept login, without passwords.
	Logins []hooksecrets.RegistryLogin `json:"logins"`
}

// RegistryLogin keeps username and password for host's registry, after
// trying them against it: deploy:image then pulls private images from host
// for every app. Admins only: a login is the server's, as Dokku's, and
// whoever may push to any app can deploy what it reaches.
func (b *Backend) RegistryLogin(ctx context.Context, u *User, host, username, password string) (*RegistryLogins, error) {
	if err := u.mayChange("registry:login"); err != nil {
		return nil, err
	}
	if err := requireAdmin(u, "registry:login"); err != nil {
		return nil, err
	}
	h, err := registryHost(host)
	if err != nil {
		return nil, err
	}
	switch {
	case username == "" || len(username) > 256 || strings.ContainsAny(username, ":\r\n"):
		return nil, Errorf(Invalid, "%q is not a registry username: give the account's name (no colon, at most 256 characters)", username)
	case password == "":
		return nil, Errorf(Invalid, "no password on stdin: echo TOKEN | ssh bex@HOST registry:login %s %s --password-stdin", host, username)
	case len(password) > 4096 || strings.ContainsAny(password, "\r\n"):
		return nil, Errorf(Invalid, "the password on stdin is not one line of at most 4096 bytes")
	}
	if b.cfg.Registries == nil {
		return nil, Errorf(Invalid, "this server does not deploy images from registries, so it keeps no logins")
	}
	if err := b.cfg.Registries.CheckLogin(ctx, h, username, password); err != nil {
		b.log.Info("registry login refused", "user", u.Name, "host", h, "registry_user", username, "err", err)
		if KindOf(err) == Internal {
			return nil, Errorf(Invalid, "%v", err)
		}
		return nil, err
	}
	store := b.registryStore()
	if err := store.Login(ctx, h, username, password); err != nil {
		return nil, fmt.Errorf("keeping the login of %s: %w", h, err)
	}
	b.audit(u, "registry:login", "", "host", h, "registry_user", username)
	logins, err := store.Logins(ctx)
	return &RegistryLogins{Host: h, Logins: logins}, err
}

// RegistryLogout forgets host's login. Admins only.
func (b *Backend) RegistryLogout(ctx context.Context, u *User, host string) (*RegistryLogins, error) {
	if err := u.mayChange("registry:logout"); err != nil {
		return nil, err
	}
	if err := requireAdmin(u, "registry:logout"); err != nil {
		return nil, err
	}
	h, err := registryHost(host)
	if err != nil {
		return nil, err
	}
	store := b.registryStore()
	removed, err := store.Logout(ctx, h)
	if err != nil {
		return nil, fmt.Errorf("forgetting the login of %s: %w", h, err)
	}
	if !removed {
		return nil, Errorf(NotFound, "no login is kept for %s (registry:login %s USER --password-stdin keeps one)", h, host)
	}
	b.audit(u, "registry:logout", "", "host", h)
	logins, err := store.Logins(ctx)
	return &RegistryLogins{Host: h, Logins: logins}, err
}

// Registries lists the kept logins, without passwords. Admins only.
func (b *Backend) Registries(ctx context.Context, u *User) (*RegistryLogins, error) {
	if err := requireAdmin(u, "registry"); err != nil {
		return nil, err
	}
	logins, err := b.registryStore().Logins(ctx)
	if err != nil {
		return nil, err
	}
	return &RegistryLogins{Logins: logins}, nil
}

func (b *Backend) registryStore() *hooksecrets.Registries {
	return &hooksecrets.Registries{Client: b.cfg.Client, Namespace: b.cfg.SecretsNamespace}
}

// registryHost is host as logins are kept under it: as go-containerregistry
// names a registry (docker.io is index.docker.io), the key pulls look up.
func registryHost(host string) (string, error) {
	bad := Errorf(Invalid, "%q is not a registry host: give HOST or HOST:PORT, e.g. ghcr.io or registry.example:5000", host)
	if host == "" || len(host) > 253 || strings.ContainsAny(host, "/@ \t\r\n") {
		return "", bad
	}
	reg, err := name.NewRegistry(host, name.StrictValidation)
	if err != nil {
		return "", bad
	}
	return reg.RegistryStr(), nil
}
