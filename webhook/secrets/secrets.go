package secrets

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
	"bex.co/bex/webhook"
)

const (
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

// Store reads webhook secrets. It implements webhook.Apps.
type Store struct {
	// Apps reads Apps, usually from an informer cache.
	Apps client.Reader
	// Secrets reads Secrets; a direct client, so that a rotation counts at once
	// and Secrets need not be cached.
	Secrets   client.Reader
	Namespace string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

var _ webhook.Apps = (*Store)(nil)

// Hook implements webhook.Apps: the app's deploy branch and its valid secrets.
func (s *Store) Hook(ctx context.Context, name string) (*webhook.Hook, error) {
	app := &appv1.App{}
	if err := s.Apps.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, app); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, webhook.ErrNoHook
		}
		return nil, err
	}
	h := &webhook.Hook{App: name, DeployBranch: app.Spec.Git.DeployBranch}
	ref := app.Spec.Git.WebhookSecretRef
	if ref == nil {
		return h, nil
	}
	st, err := s.state(ctx, ref)
	if err != nil {
		return nil, err
	}
	h.Secrets = st.valid(s.now())
	return h, nil
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
	if err := s.Secrets.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: ref.Name}, sec); err != nil {
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

// Rotate writes a new random secret under ref (app's, or DefaultRef) and returns
// it; the one it replaces keeps verifying for PreviousValidity. The Secret is
// created, owned by app, when it does not exist. The caller sets ref on the App
// when it had none.
func Rotate(ctx context.Context, c client.Client, app *appv1.App, ref *appv1.SecretKeySelector, now time.Time) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	value := hex.EncodeToString(b[:])
	sec := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKey{Namespace: app.Namespace, Name: ref.Name}, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ref.Name, Namespace: app.Namespace,
				Labels: map[string]string{"app.bex.co/app": app.Name, "app.bex.co/secret": "webhook"}},
			Data: map[string][]byte{ref.Key: []byte(value)},
		}
		if err := controllerutil.SetOwnerReference(app, sec, c.Scheme()); err != nil {
			return "", err
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
	if old := sec.Data[ref.Key]; len(old) > 0 {
		sec.Data[ref.Key+PreviousSuffix] = old
		sec.Annotations[AnnotationPreviousExpires] = now.Add(PreviousValidity).UTC().Format(time.RFC3339)
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
