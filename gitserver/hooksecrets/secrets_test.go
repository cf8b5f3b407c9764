package hooksecrets_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
)

func TestRotation(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps", UID: "u1"}, Spec: appv1.AppSpec{Git: appv1.GitSpec{DeployBranch: "prod"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(app).Build()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := &hooksecrets.Store{Apps: c, Secrets: c, Namespace: "apps", SecretsNamespace: "apps", Now: func() time.Time { return now }}
	ctx := context.Background()

	h, err := hookOf(ctx, store, app.Spec.Git.WebhookSecretRef)
	if err != nil || len(h.Secrets) != 0 {
		t.Fatalf("app without a secret: %+v %v", h, err)
	}

	ref := hooksecrets.DefaultRef("shop")
	first, err := hooksecrets.Rotate(ctx, c, "apps", app, ref, now)
	if err != nil || len(first) != 64 {
		t.Fatalf("first secret %q %v", first, err)
	}
	app.Spec.Git.WebhookSecretRef = ref
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "shop-webhook"}, sec); err != nil || len(sec.OwnerReferences) != 1 {
		t.Fatalf("the secret is not owned by its app: %+v %v", sec.OwnerReferences, err)
	}
	h, _ = hookOf(ctx, store, ref)
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != first {
		t.Fatalf("after the first rotation: %q", h.Secrets)
	}

	second, err := hooksecrets.Rotate(ctx, c, "apps", app, ref, now)
	if err != nil || second == first {
		t.Fatalf("second secret %q %v", second, err)
	}
	h, _ = hookOf(ctx, store, ref)
	if len(h.Secrets) != 2 || string(h.Secrets[0]) != second || !bytes.Equal(h.Secrets[1], []byte(first)) {
		t.Fatalf("during the rotation: %q", h.Secrets)
	}
	st, _ := store.Get(ctx, ref)
	if !st.Set || !st.PreviousUntil.Equal(now.Add(24*time.Hour)) {
		t.Fatalf("state %+v", st)
	}
	// 24 hours later only the new one verifies.
	now = now.Add(24 * time.Hour)
	h, _ = hookOf(ctx, store, ref)
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != second {
		t.Fatalf("after the previous expired: %q", h.Secrets)
	}
	if st, _ := store.Get(ctx, ref); !st.PreviousUntil.IsZero() {
		t.Fatalf("an expired previous secret is reported: %+v", st)
	}

	now = now.Add(-time.Hour)
	if err := hooksecrets.DropPrevious(ctx, c, "apps", ref); err != nil {
		t.Fatal(err)
	}
	h, _ = hookOf(ctx, store, ref)
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != second {
		t.Fatalf("after dropping the previous: %q", h.Secrets)
	}
	if err := hooksecrets.DropPrevious(ctx, c, "apps", ref); !errors.Is(err, hooksecrets.ErrNoPrevious) {
		t.Fatalf("dropping twice: %v", err)
	}
}

// hookOf is what the backend's Hook reads of the webhook ref names: the
// secrets that verify now.
func hookOf(ctx context.Context, s *hooksecrets.Store, ref *appv1.SecretKeySelector) (struct{ Secrets [][]byte }, error) {
	v, err := s.Valid(ctx, ref)
	return struct{ Secrets [][]byte }{v}, err
}
