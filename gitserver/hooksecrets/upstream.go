package hooksecrets

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

const (
	// KindDeployKey labels the Secret of an app's deploy key (LabelKind).
	KindDeployKey = "deploy-key"
	// KindUpstreamCredentials labels the Secret of an app's upstream username and
	// password.
	KindUpstreamCredentials = "upstream-credentials"
	// AnnotationAppUID on a deploy key's or credentials' Secret is the uid of the
	// App it was made for: a Secret left by an app of the same name (destroyed
	// without apps:destroy) is not the new app's.
	AnnotationAppUID = "app.bex.co/app-uid"
	// DeployKeyKey and the basic-auth keys are the keys of those Secrets, after
	// Kubernetes' ssh-auth and basic-auth Secret types.
	DeployKeyKey = corev1.SSHAuthPrivateKey
	UsernameKey  = corev1.BasicAuthUsernameKey
	PasswordKey  = corev1.BasicAuthPasswordKey
)

// DeployKeyName is the name of the Secret of app's deploy key.
func DeployKeyName(app string) string { return app + "-deploy-key" }

// CredentialsName is the name of the Secret of app's upstream credentials.
func CredentialsName(app string) string { return app + "-upstream" }

// Upstreams keeps what apps fetch their upstreams with: each app's own ed25519
// deploy key, made when first needed, and the username and password of an https
// upstream. It is the gitserver's UpstreamAuth, and the backend's store for
// `webhooks`, `webhooks:deploy-key` and `webhooks:upstream --username`.
type Upstreams struct {
	// Client reads Apps and writes Secrets; a direct client, so that a rotation
	// counts at once.
	Client client.Client
	// Namespace holds the Apps; SecretsNamespace the Secrets (empty: Namespace).
	Namespace, SecretsNamespace string
}

func (u *Upstreams) secretsNamespace() string {
	if u.SecretsNamespace != "" {
		return u.SecretsNamespace
	}
	return u.Namespace
}

func (u *Upstreams) app(ctx context.Context, name string) (*appv1.App, error) {
	a := &appv1.App{}
	if err := u.Client.Get(ctx, client.ObjectKey{Namespace: u.Namespace, Name: name}, a); err != nil {
		return nil, err
	}
	return a, nil
}

// read returns the Secret name of kind made for app, or nil when there is none
// (or only one made for another app of that name, or by someone else).
func (u *Upstreams) read(ctx context.Context, app *appv1.App, name, kind string) (*corev1.Secret, bool, error) {
	sec := &corev1.Secret{}
	err := u.Client.Get(ctx, client.ObjectKey{Namespace: u.secretsNamespace(), Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading secret %s: %w", name, err)
	}
	ours := sec.Labels[LabelApp] == app.Name && sec.Labels[LabelKind] == kind && sec.Annotations[AnnotationAppUID] == string(app.UID)
	return sec, ours, nil
}

// write creates the Secret of kind for app with data, or replaces the data of
// existing (read with its resourceVersion: two writes at once conflict).
func (u *Upstreams) write(ctx context.Context, app *appv1.App, existing *corev1.Secret, name, kind string, typ corev1.SecretType, data map[string][]byte) error {
	if existing != nil {
		if existing.Labels == nil {
			existing.Labels = map[string]string{}
		}
		if existing.Annotations == nil {
			existing.Annotations = map[string]string{}
		}
		existing.Labels[LabelApp], existing.Labels[LabelKind] = app.Name, kind
		existing.Annotations[AnnotationAppUID] = string(app.UID)
		existing.Data = data
		if err := u.Client.Update(ctx, existing); err != nil {
			return fmt.Errorf("updating secret %s: %w", name, err)
		}
		return nil
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: u.secretsNamespace(),
			Labels:      map[string]string{LabelApp: app.Name, LabelKind: kind},
			Annotations: map[string]string{AnnotationAppUID: string(app.UID)}},
		Type: typ,
		Data: data,
	}
	// As for the webhook Secret: owned by the App only in its own namespace.
	if sec.Namespace == app.Namespace {
		if err := controllerutil.SetOwnerReference(app, sec, u.Client.Scheme()); err != nil {
			return err
		}
	}
	if err := u.Client.Create(ctx, sec); err != nil {
		return fmt.Errorf("creating secret %s: %w", name, err)
	}
	return nil
}

func newDeployKey(app string) ([]byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := gossh.MarshalPrivateKey(priv, "bex deploy key of "+app)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(block), nil
}

// DeployKey returns the deploy key of the app named app, made when it has none.
func (u *Upstreams) DeployKey(ctx context.Context, app string) (gossh.Signer, error) {
	a, err := u.app(ctx, app)
	if err != nil {
		return nil, err
	}
	return u.EnsureDeployKey(ctx, a)
}

// EnsureDeployKey returns app's deploy key, made when it has none.
func (u *Upstreams) EnsureDeployKey(ctx context.Context, app *appv1.App) (gossh.Signer, error) {
	for range 3 {
		sec, ours, err := u.read(ctx, app, DeployKeyName(app.Name), KindDeployKey)
		if err != nil {
			return nil, err
		}
		if ours {
			if s, err := gossh.ParsePrivateKey(sec.Data[DeployKeyKey]); err == nil {
				return s, nil
			}
		}
		s, err := u.replaceDeployKey(ctx, app, sec)
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			continue // made at the same time by another call: read it
		}
		return s, err
	}
	return nil, fmt.Errorf("the deploy key of %s kept changing while it was made", app.Name)
}

// RotateDeployKey gives app a new deploy key; the old one no longer fetches
// from the next fetch on.
func (u *Upstreams) RotateDeployKey(ctx context.Context, app *appv1.App) (gossh.Signer, error) {
	sec, _, err := u.read(ctx, app, DeployKeyName(app.Name), KindDeployKey)
	if err != nil {
		return nil, err
	}
	return u.replaceDeployKey(ctx, app, sec)
}

func (u *Upstreams) replaceDeployKey(ctx context.Context, app *appv1.App, existing *corev1.Secret) (gossh.Signer, error) {
	pemKey, err := newDeployKey(app.Name)
	if err != nil {
		return nil, err
	}
	if err := u.write(ctx, app, existing, DeployKeyName(app.Name), KindDeployKey, corev1.SecretTypeSSHAuth, map[string][]byte{DeployKeyKey: pemKey}); err != nil {
		return nil, err
	}
	return gossh.ParsePrivateKey(pemKey)
}

// Credentials returns the username and password the app named app fetches its
// https upstream with; ok is false when it has none.
func (u *Upstreams) Credentials(ctx context.Context, app string) (username, password string, ok bool, err error) {
	a, err := u.app(ctx, app)
	if err != nil {
		return "", "", false, err
	}
	sec, ours, err := u.read(ctx, a, CredentialsName(app), KindUpstreamCredentials)
	if err != nil || !ours {
		return "", "", false, err
	}
	return string(sec.Data[UsernameKey]), string(sec.Data[PasswordKey]), true, nil
}

// Username returns the username kept for app's upstream, "" when none.
func (u *Upstreams) Username(ctx context.Context, app *appv1.App) (string, error) {
	sec, ours, err := u.read(ctx, app, CredentialsName(app.Name), KindUpstreamCredentials)
	if err != nil || !ours {
		return "", err
	}
	return string(sec.Data[UsernameKey]), nil
}

// SetCredentials keeps username and password for app's upstream.
func (u *Upstreams) SetCredentials(ctx context.Context, app *appv1.App, username, password string) error {
	sec, _, err := u.read(ctx, app, CredentialsName(app.Name), KindUpstreamCredentials)
	if err != nil {
		return err
	}
	return u.write(ctx, app, sec, CredentialsName(app.Name), KindUpstreamCredentials, corev1.SecretTypeBasicAuth,
		map[string][]byte{UsernameKey: []byte(username), PasswordKey: []byte(password)})
}

// DeleteCredentials removes the credentials kept for app's upstream, if any.
func (u *Upstreams) DeleteCredentials(ctx context.Context, app *appv1.App) error {
	return deleteIfKind(ctx, u.Client, u.secretsNamespace(), CredentialsName(app.Name), app.Name, KindUpstreamCredentials)
}

// deleteIfKind deletes the Secret name when its labels say bex made it, of kind,
// for app.
func deleteIfKind(ctx context.Context, c client.Client, namespace, name, app, kind string) error {
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading secret %s: %w", name, err)
	}
	if sec.Labels[LabelApp] != app || sec.Labels[LabelKind] != kind {
		return nil
	}
	if err := c.Delete(ctx, sec, client.Preconditions{UID: &sec.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return nil
}
