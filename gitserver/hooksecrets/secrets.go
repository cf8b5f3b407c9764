package hooksecrets

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

const (
	// LabelApp and LabelKind label the Secrets bex makes: the app's name, and
	// KindWebhook.
	LabelApp    = appv1.LabelApp
	LabelKind   = appv1.LabelSecret
	KindWebhook = "webhook"
	// DefaultKey is the key of the secret in the Secret bex makes.
	DefaultKey = "secret"
	// PreviousSuffix names the key that keeps the secret a rotation replaced.
	PreviousSuffix = ".previous"
	// AnnotationPreviousExpires on the Secret is when the previous secret stops
	// verifying (RFC 3339).
	AnnotationPreviousExpires = "app.bex.co/previous-expires"
	// PreviousValidity is how long a replaced secret keeps verifying.
	PreviousValidity = 24 * time.Hour
)

// SecretName is the name of the Secret bex makes for app's webhook.
func SecretName(app string) string { return app + "-webhook" }

// DefaultRef is the reference bex sets on an App that has none.
func DefaultRef(app string) *appv1.SecretKeySelector {
	return &appv1.SecretKeySelector{Name: SecretName(app), Key: DefaultKey}
}

// Store reads webhook secrets.
type Store struct {
	// Apps reads Apps, usually from an informer cache.
	Apps client.Reader
	// Secrets reads Secrets; a direct client, so that a rotation counts at once
	// and Secrets need not be cached.
	Secrets client.Reader
	// Namespace holds the Apps.
	Namespace string
	// SecretsNamespace holds the webhook Secrets (the gitserver's
	// --secrets-namespace); empty: Namespace.
	SecretsNamespace string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (s *Store) secretsNamespace() string {
	if s.SecretsNamespace != "" {
		return s.SecretsNamespace
	}
	return s.Namespace
}

// Valid returns the secrets that verify deliveries for the webhook ref names:
// the current one, then during a rotation the previous one; none when ref is nil
// or its Secret is missing.
func (s *Store) Valid(ctx context.Context, ref *appv1.SecretKeySelector) ([][]byte, error) {
	if ref == nil {
		return nil, nil
	}
	st, err := s.state(ctx, ref)
	if err != nil {
		return nil, err
	}
	return st.valid(s.now()), nil
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// State is what is known of an app's webhook secret, without its values.
type State struct {
	Set bool
	// PreviousUntil is when the previous secret stops verifying; zero when there is
	// none.
	PreviousUntil time.Time

	current, previous []byte
}

func (st State) valid(now time.Time) [][]byte {
	var out [][]byte
	if len(st.current) > 0 {
		out = append(out, st.current)
	}
	if len(st.previous) > 0 && now.Before(st.PreviousUntil) {
		out = append(out, st.previous)
	}
	return out
}

// Get returns the state of the secret ref names.
func (s *Store) Get(ctx context.Context, ref *appv1.SecretKeySelector) (State, error) {
	if ref == nil {
		return State{}, nil
	}
	st, err := s.state(ctx, ref)
	if !st.PreviousUntil.IsZero() && !s.now().Before(st.PreviousUntil) {
		st.PreviousUntil = time.Time{}
	}
	return st, err
}

func (s *Store) state(ctx context.Context, ref *appv1.SecretKeySelector) (State, error) {
	sec := &corev1.Secret{}
	if err := s.Secrets.Get(ctx, client.ObjectKey{Namespace: s.secretsNamespace(), Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return State{}, nil
		}
		return State{}, fmt.Errorf("reading secret %s: %w", ref.Name, err)
	}
	st := State{current: sec.Data[ref.Key], previous: sec.Data[ref.Key+PreviousSuffix]}
	st.Set = len(st.current) > 0
	if len(st.previous) > 0 {
		if t, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationPreviousExpires]); err == nil {
			st.PreviousUntil = t
		}
	}
	return st, nil
}

// Rotate writes a new random secret under ref (app's, or DefaultRef) in the Secret
// of that name in namespace (the secrets namespace) and returns it; the one it
// replaces keeps verifying for PreviousValidity (unless app has no ref yet: then
// nothing verified before, and no previous is kept). The Secret is created when it
// does not exist, labelled with the app, and owned by app when it is in app's
// namespace: an owner reference cannot name an object of another namespace (the
// garbage collector would take the owner for gone and delete the Secret), so in
// another namespace the Secret has no owner and Delete removes it with the app.
// The caller sets ref on the App when it had none.
func Rotate(ctx context.Context, c client.Client, namespace string, app *appv1.App, ref *appv1.SecretKeySelector, now time.Time) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	value := hex.EncodeToString(b[:])
	sec := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: namespace,
				Labels: map[string]string{LabelApp: app.Name, LabelKind: KindWebhook}},
			Data: map[string][]byte{ref.Key: []byte(value)},
		}
		if namespace == app.Namespace {
			if err := controllerutil.SetOwnerReference(app, sec, c.Scheme()); err != nil {
				return "", err
			}
		}
		if err := c.Create(ctx, sec); err != nil {
			return "", fmt.Errorf("creating secret %s: %w", ref.Name, err)
		}
		return value, nil
	case err != nil:
		return "", fmt.Errorf("reading secret %s: %w", ref.Name, err)
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	// A first secret (the App has no ref yet) replaces nothing that verified: the
	// Secret is one left by an app of the same name deleted without apps:destroy,
	// or by a rotation whose App update failed, and its value must not verify.
	if old := sec.Data[ref.Key]; len(old) > 0 && app.Spec.Git.WebhookSecretRef != nil {
		sec.Data[ref.Key+PreviousSuffix] = old
		sec.Annotations[AnnotationPreviousExpires] = now.Add(PreviousValidity).UTC().Format(time.RFC3339)
	} else {
		delete(sec.Data, ref.Key+PreviousSuffix)
		delete(sec.Annotations, AnnotationPreviousExpires)
	}
	sec.Data[ref.Key] = []byte(value)
	// The Update carries the resourceVersion read: two rotations at once conflict
	// rather than lose a secret someone was just shown.
	if err := c.Update(ctx, sec); err != nil {
		return "", fmt.Errorf("updating secret %s: %w", ref.Name, err)
	}
	return value, nil
}

// ErrNoPrevious is returned by DropPrevious when there is nothing to drop.
var ErrNoPrevious = errors.New("no previous secret")

// DropPrevious ends the validity of the secret the last rotation replaced.
func DropPrevious(ctx context.Context, c client.Client, namespace string, ref *appv1.SecretKeySelector) error {
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return ErrNoPrevious
		}
		return err
	}
	if _, ok := sec.Data[ref.Key+PreviousSuffix]; !ok {
		return ErrNoPrevious
	}
	delete(sec.Data, ref.Key+PreviousSuffix)
	delete(sec.Annotations, AnnotationPreviousExpires)
	return c.Update(ctx, sec)
}

// Delete removes the webhook Secrets, the deploy key and the upstream
// credentials bex made for app from namespace (the secrets
// namespace): the one app's webhookSecretRef names and the default one, each only
// when its labels say bex made it for this app (a Secret of one's own that the ref
// names stays). It is called when the app is destroyed: nothing else removes a
// Secret that has no owner reference, and a later app of the same name must not
// find the old secret still verifying.
func Delete(ctx context.Context, c client.Client, namespace string, app *appv1.App) error {
	names := []string{SecretName(app.Name)}
	if ref := app.Spec.Git.WebhookSecretRef; ref != nil && ref.Name != names[0] {
		names = append(names, ref.Name)
	}
	for _, name := range names {
		// The uid read is the delete's precondition: a Secret made again
		// meanwhile is not this one.
		if err := deleteIfKind(ctx, c, namespace, name, app.Name, KindWebhook); err != nil {
			return err
		}
	}
	// The app's deploy key and upstream credentials go with it too.
	if err := deleteIfKind(ctx, c, namespace, DeployKeyName(app.Name), app.Name, KindDeployKey); err != nil {
		return err
	}
	return deleteIfKind(ctx, c, namespace, CredentialsName(app.Name), app.Name, KindUpstreamCredentials)
}
