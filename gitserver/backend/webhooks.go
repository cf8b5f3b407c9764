package backend

import (
	"context"
	"errors"
	"strings"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
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
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	st, err := b.secretStore().Get(ctx, a.Spec.Git.WebhookSecretRef)
	if err != nil {
		return nil, err
	}
	out := &WebhookInfo{App: a.Name, URL: b.hookURL(a.Name), SecretSet: st.Set, Ref: "refs/heads/" + deployBranch(a), Upstream: a.Spec.Git.Upstream}
	if !st.PreviousUntil.IsZero() {
		t := st.PreviousUntil.UTC()
		out.PreviousValidUntil = &t
	}
	if b.cfg.DeployKey != nil {
		out.DeployKey = b.cfg.DeployKey()
	}
	return out, nil
}

// RotateWebhookSecret makes an app's webhook secret, or a new one that
// replaces it (the old one verifies too for hooksecrets.PreviousValidity). The
// secret is in the result, shown once.
func (b *Backend) RotateWebhookSecret(ctx context.Context, u *User, name string) (*WebhookSecret, error) {
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
// from ("": rebuild the current commit). It returns whether the app has a
// webhook secret (without one, no delivery is taken).
func (b *Backend) SetUpstream(ctx context.Context, u *User, name, url string) (hasSecret bool, err error) {
	if url != "" && !validUpstream(url) {
		return false, Errorf(Invalid, "upstream %q: want https://HOST/PATH, ssh://HOST/PATH, git@HOST:PATH or file:///PATH", url)
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
		a, err := b.app(ctx, u, name)
		if err != nil {
			return false, err
		}
		return a.Spec.Git.WebhookSecretRef != nil, nil
	case err != nil:
		return false, err
	}
	b.audit(u, "webhooks:upstream", name, "upstream", url)
	return app.Spec.Git.WebhookSecretRef != nil, nil
}

func validUpstream(url string) bool {
	if len(url) > 2048 || strings.ContainsAny(url, " \t\n") {
		return false
	}
	for _, p := range []string{"https://", "ssh://", "git@", "file:///"} {
		if strings.HasPrefix(url, p) && len(url) > len(p) {
			return true
		}
	}
	return false
}
