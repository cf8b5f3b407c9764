package secrets_test

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
	"bex.co/bex/gitserver/webhook"
	"bex.co/bex/gitserver/webhook/secrets"
)

func TestRotation(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps", UID: "u1"}, Spec: appv1.AppSpec{Git: appv1.GitSpec{DeployBranch: "prod"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(app).Build()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := &secrets.Store{Apps: c, Secrets: c, Namespace: "apps", SecretsNamespace: "apps", Now: func() time.Time { return now }}
	ctx := context.Background()

	if _, err := store.Hook(ctx, "nope"); !errors.Is(err, webhook.ErrNoHook) {
		t.Fatalf("unknown app: %v", err)
	}
	h, err := store.Hook(ctx, "shop")
	if err != nil || len(h.Secrets) != 0 || h.DeployBranch != "prod" {
		t.Fatalf("app without a secret: %+v %v", h, err)
	}

	ref := secrets.DefaultRef("shop")
	first, err := secrets.Rotate(ctx, c, "apps", app, ref, now)
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
	h, _ = store.Hook(ctx, "shop")
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != first {
		t.Fatalf("after the first rotation: %q", h.Secrets)
	}

	second, err := secrets.Rotate(ctx, c, "apps", app, ref, now)
	if err != nil || second == first {
		t.Fatalf("second secret %q %v", second, err)
	}
	h, _ = store.Hook(ctx, "shop")
	if len(h.Secrets) != 2 || string(h.Secrets[0]) != second || !bytes.Equal(h.Secrets[1], []byte(first)) {
		t.Fatalf("during the rotation: %q", h.Secrets)
	}
	st, _ := store.Get(ctx, ref)
	if !st.Set || !st.PreviousUntil.Equal(now.Add(24*time.Hour)) {
		t.Fatalf("state %+v", st)
	}
	// 24 hours later only the new one verifies.
	now = now.Add(24 * time.Hour)
	h, _ = store.Hook(ctx, "shop")
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != second {
		t.Fatalf("after the previous expired: %q", h.Secrets)
	}
	if st, _ := store.Get(ctx, ref); !st.PreviousUntil.IsZero() {
		t.Fatalf("an expired previous secret is reported: %+v", st)
	}

	now = now.Add(-time.Hour)
	if err := secrets.DropPrevious(ctx, c, "apps", ref); err != nil {
		t.Fatal(err)
	}
	h, _ = store.Hook(ctx, "shop")
	if len(h.Secrets) != 1 || string(h.Secrets[0]) != second {
		t.Fatalf("after dropping the previous: %q", h.Secrets)
	}
	if err := secrets.DropPrevious(ctx, c, "apps", ref); !errors.Is(err, secrets.ErrNoPrevious) {
		t.Fatalf("dropping twice: %v", err)
	}
}
