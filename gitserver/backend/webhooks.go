package backend

import (
	"context"
	"errors"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
	"bex.co/bex/gitserver/upstream"
)

// hookURL is app's webhook URL, or "" when this server serves none.
func (b *Backend) hookURL(app string) string {
	if b.cfg.HooksURL == "" {
		return ""
	}
	return strings.TrimSuffix(b.cfg.HooksURL, "/") + "/hooks/" + app
}

// Webhook is an app's webhook: its URL, whether a secret is set, what it
// deploys.
func (b *Backend) Webhook(ctx context.Context, u *User, name string) (*WebhookInfo, error) {
	// It makes the app's deploy key when it has none.
	if err := u.unlimited("webhooks"); err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	st, err := b.secretStore().Get(ctx, a.Spec.Git.WebhookSecretRef)
	if err != nil {
		return nil, err
	}
	out := &WebhookInfo{App: a.Name, URL: b.hookURL(a.Name), SecretSet: st.Set, Ref: "refs/heads/" + deployBranch(a), Upstream: upstream.Redact(a.Spec.Git.Upstream)}
	if !st.PreviousUntil.IsZero() {
		t := st.PreviousUntil.UTC()
		out.PreviousValidUntil = &t
	}
	// The app's own deploy key, made the first time it is asked for: what to add
	// to the git host before pointing the app at an ssh upstream.
	key, err := b.upstreams().EnsureDeployKey(ctx, a)
	if err != nil {
		return nil, err
	}
	out.DeployKey = authorizedKey(key.PublicKey())
	if out.UpstreamUsername, err = b.upstreams().Username(ctx, a); err != nil {
		return nil, err
	}
	return out, nil
}

// RotateWebhookSecret makes an app's webhook secret, or a new one that
// replaces it (the old one verifies too for hooksecrets.PreviousValidity). The
// secret is in the result, shown once.
func (b *Backend) RotateWebhookSecret(ctx context.Context, u *User, name string) (*WebhookSecret, error) {
	if err := u.mayChange("webhooks:secret"); err != nil {
		return nil, err
	}
	if err := u.unlimited("webhooks:secret"); err != nil {
		return nil, err
	}
	app, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	ref := app.Spec.Git.WebhookSecretRef
	if ref == nil {
		ref = hooksecrets.DefaultRef(app.Name)
	}
	value, err := hooksecrets.Rotate(ctx, b.cfg.Client, b.cfg.SecretsNamespace, app, ref, time.Now())
	if err != nil {
		return nil, err
	}
	if app.Spec.Git.WebhookSecretRef == nil {
		if _, err := b.update(ctx, u, app.Name, func(a *appv1.App) error {
			if a.Spec.Git.WebhookSecretRef == nil {
				a.Spec.Git.WebhookSecretRef = ref
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	st, err := b.secretStore().Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	b.audit(u, "webhooks:secret", app.Name, "rotated", !st.PreviousUntil.IsZero())
	out := &WebhookSecret{App: app.Name, URL: b.hookURL(app.Name), Secret: value}
	if !st.PreviousUntil.IsZero() {
		t := st.PreviousUntil.UTC()
		out.PreviousValidUntil = &t
	}
	return out, nil
}

// DropPreviousWebhookSecret stops accepting the secret the last rotation
// replaced, now.
func (b *Backend) DropPreviousWebhookSecret(ctx context.Context, u *User, name string) error {
	if err := u.mayChange("webhooks:secret --drop-previous"); err != nil {
		return err
	}
	if err := u.unlimited("webhooks:secret --drop-previous"); err != nil {
		return err
	}
	app, err := b.app(ctx, u, name)
	if err != nil {
		return err
	}
	ref := app.Spec.Git.WebhookSecretRef
	if ref == nil {
		return Errorf(NotFound, "%s has no webhook secret: webhooks:secret %s makes one", app.Name, app.Name)
	}
	if err := hooksecrets.DropPrevious(ctx, b.cfg.Client, b.cfg.SecretsNamespace, ref); err != nil {
		if errors.Is(err, hooksecrets.ErrNoPrevious) {
			return Errorf(NotFound, "%s has no previous webhook secret to drop", app.Name)
		}
		return err
	}
	b.audit(u, "webhooks:secret", app.Name, "dropPrevious", true)
	return nil
}

// SetUpstream sets where webhook deliveries and deploys fetch an app's code
// from ("": rebuild the current commit), with creds, when not nil, kept in a
// Secret for the fetch (https only). The URL is refused when this server would
// not fetch it (upstream.Policy.Check: credentials in it, a loopback, private,
// link-local or metadata address, a file:// URL unless allowed). Credentials kept
// before are dropped when the upstream changes without new ones: they were
// given for the old URL, and must not go to a new host. It returns whether the
// app has a webhook secret (without one, no delivery is taken) and, for an ssh
// upstream, the app's deploy key (made now if need be) to add to the git host.
func (b *Backend) SetUpstream(ctx context.Context, u *User, name, url string, creds *UpstreamCredentials) (*UpstreamSet, error) {
	if err := u.mayChange("webhooks:upstream"); err != nil {
		return nil, err
	}
	if err := u.unlimited("webhooks:upstream"); err != nil {
		return nil, err
	}
	if url != "" {
		if err := b.cfg.UpstreamPolicy.Check(ctx, url); err != nil {
			return nil, Errorf(Invalid, "%s", strings.TrimPrefix(err.Error(), upstream.ErrRefused.Error()+": "))
		}
	}
	if creds != nil {
		switch {
		case url == "" || !strings.HasPrefix(url, "https://"):
			return nil, Errorf(Invalid, "--username and --password-stdin are for https:// upstreams (ssh ones use the app's deploy key: webhooks %s)", name)
		case creds.Username == "" || strings.ContainsAny(creds.Username, ":\r\n"):
			return nil, Errorf(Invalid, "--username: give a username without ':' or a newline")
		case creds.Password == "" || len(creds.Password) > 4096:
			return nil, Errorf(Invalid, "--password-stdin: give the password (or token) on stdin, up to 4096 bytes")
		}
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		if err := b.upstreams().SetCredentials(ctx, a, creds.Username, creds.Password); err != nil {
			return nil, err
		}
	} else if a.Spec.Git.Upstream != url || url == "" {
		if err := b.upstreams().DeleteCredentials(ctx, a); err != nil {
			return nil, err
		}
	}
	app, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if app.Spec.Git.Upstream == url {
			return errNoChange
		}
		app.Spec.Git.Upstream = url
		return nil
	})
	switch {
	case errors.Is(err, errNoChange):
		app = a
		if creds != nil {
			b.audit(u, "webhooks:upstream", name, "credentials", true)
		}
	case err != nil:
		return nil, err
	default:
		b.audit(u, "webhooks:upstream", name, "upstream", url, "credentials", creds != nil)
	}
	out := &UpstreamSet{App: app.Name, Upstream: url, HasSecret: app.Spec.Git.WebhookSecretRef != nil, Credentials: creds != nil}
	if ep, err := upstream.Parse(url); err == nil && ep.Protocol == "ssh" {
		key, err := b.upstreams().EnsureDeployKey(ctx, app)
		if err != nil {
			return nil, err
		}
		out.DeployKey = authorizedKey(key.PublicKey())
	}
	return out, nil
}

// UpstreamSet is what SetUpstream did.
type UpstreamSet struct {
	App, Upstream string
	// HasSecret: the app has a webhook secret (without one no delivery is taken).
	HasSecret bool
	// Credentials: a username and password are kept for the upstream.
	Credentials bool
	// DeployKey is the app's deploy key, for an ssh upstream.
	DeployKey string
}

// DeployKey returns an app's deploy key (made when it has none), or with
// rotate a new one in its place: the old one no longer fetches.
func (b *Backend) DeployKey(ctx context.Context, u *User, name string, rotate bool) (*DeployKeyInfo, error) {
	if rotate {
		if err := u.mayChange("webhooks:deploy-key --rotate"); err != nil {
			return nil, err
		}
	}
	// Without rotate, it makes the key when the app has none.
	if err := u.unlimited("webhooks:deploy-key"); err != nil {
		return nil, err
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	store := b.upstreams()
	get := store.EnsureDeployKey
	if rotate {
		get = store.RotateDeployKey
	}
	key, err := get(ctx, a)
	if err != nil {
		return nil, err
	}
	if rotate {
		b.audit(u, "webhooks:deploy-key", a.Name, "rotated", true, "fingerprint", gossh.FingerprintSHA256(key.PublicKey()))
	}
	return &DeployKeyInfo{App: a.Name, DeployKey: authorizedKey(key.PublicKey()), Rotated: rotate}, nil
}

func (b *Backend) upstreams() *hooksecrets.Upstreams {
	return &hooksecrets.Upstreams{Client: b.cfg.Client, Namespace: b.cfg.Namespace, SecretsNamespace: b.cfg.SecretsNamespace}
}

func authorizedKey(k gossh.PublicKey) string {
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k)))
}
