package hooksecrets_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestSecretsNamespace, on a real API server: with the Apps in one namespace and
// the secrets in another, the webhook Secret is made in the secrets namespace
// without an owner reference (none can cross namespaces), the handler's lookup
// finds it there, nothing appears among the apps' Secrets, and Delete removes
// what bex made and leaves a Secret of one's own that a ref names. In the App's
// own namespace the Secret is still owned by the App.
func TestSecretsNamespace(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	c := cp.Client
	ctx := context.Background()
	appsNS, secretsNS := cp.Namespace(t, "apps"), cp.Namespace(t, "bex-system")
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: appsNS}}
	if err := c.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	store := &hooksecrets.Store{Apps: c, Secrets: c, Namespace: appsNS, SecretsNamespace: secretsNS}

	ref := hooksecrets.DefaultRef("shop")
	value, err := hooksecrets.Rotate(ctx, c, secretsNS, app, ref, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "shop-webhook"}, sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.OwnerReferences) != 0 || sec.Labels[hooksecrets.LabelApp] != "shop" || sec.Labels[hooksecrets.LabelKind] != hooksecrets.KindWebhook {
		t.Fatalf("the Secret in the secrets namespace: owners %+v, labels %v", sec.OwnerReferences, sec.Labels)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: appsNS, Name: "shop-webhook"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a webhook Secret among the apps' Secrets: %v", err)
	}
	app.Spec.Git.WebhookSecretRef = ref
	if err := c.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	h, err := hookOf(ctx, store, ref)
	if err != nil || len(h.Secrets) != 1 || string(h.Secrets[0]) != value {
		t.Fatalf("lookup across namespaces: %+v %v", h, err)
	}
	if err := hooksecrets.DropPrevious(ctx, c, secretsNS, ref); err != hooksecrets.ErrNoPrevious {
		t.Fatalf("DropPrevious with none: %v", err)
	}

	// An app whose ref names a Secret of one's own: Rotate writes into it, Delete
	// leaves it.
	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ci-hook", Namespace: secretsNS}, Data: map[string][]byte{"k": []byte("x")}}
	if err := c.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	blog := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "blog", Namespace: appsNS},
		Spec: appv1.AppSpec{Git: appv1.GitSpec{WebhookSecretRef: &appv1.SecretKeySelector{Name: "ci-hook", Key: "k"}}}}
	if err := c.Create(ctx, blog); err != nil {
		t.Fatal(err)
	}
	if _, err := hooksecrets.Rotate(ctx, c, secretsNS, blog, blog.Spec.Git.WebhookSecretRef, time.Now()); err != nil {
		t.Fatal(err)
	}

	for _, a := range []*appv1.App{app, blog} {
		if err := hooksecrets.Delete(ctx, c, secretsNS, a); err != nil {
			t.Fatalf("Delete %s: %v", a.Name, err)
		}
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "shop-webhook"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook Secret outlives its app: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "ci-hook"}, &corev1.Secret{}); err != nil {
		t.Fatalf("a Secret bex did not make was deleted: %v", err)
	}
	if err := hooksecrets.Delete(ctx, c, secretsNS, app); err != nil {
		t.Fatalf("Delete again: %v", err)
	}

	// A Secret left behind (the App deleted with kubectl, made again): the first
	// secret of the new app keeps no previous, so the old value verifies nothing.
	stale := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-webhook", Namespace: secretsNS,
		Labels: map[string]string{hooksecrets.LabelApp: "shop", hooksecrets.LabelKind: hooksecrets.KindWebhook}},
		Data: map[string][]byte{"secret": []byte("old")}}
	if err := c.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	app.Spec.Git.WebhookSecretRef = nil
	if _, err := hooksecrets.Rotate(ctx, c, secretsNS, app, ref, time.Now()); err != nil {
		t.Fatal(err)
	}
	app.Spec.Git.WebhookSecretRef = ref
	if st, err := store.Get(ctx, ref); err != nil || !st.Set || !st.PreviousUntil.IsZero() {
		t.Fatalf("a stale Secret's value kept as the previous one: %+v %v", st, err)
	}
	if h, _ := hookOf(ctx, store, ref); len(h.Secrets) != 1 || string(h.Secrets[0]) == "old" {
		t.Fatalf("after a first secret over a stale Secret: %q", h.Secrets)
	}
	if err := hooksecrets.Delete(ctx, c, secretsNS, app); err != nil {
		t.Fatal(err)
	}

	// One namespace (bex up): owned by the App, as before.
	if _, err := hooksecrets.Rotate(ctx, c, appsNS, app, ref, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: appsNS, Name: "shop-webhook"}, sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != app.UID {
		t.Fatalf("in the App's namespace the Secret is not owned by it: %+v", sec.OwnerReferences)
	}
}
