package backend_test

import (
	"context"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// TestConfigValues: an app's config values for masking are its literal ones
// and, through ConfigSecrets, those its vars take from a Secret (a database
// link's URL, and the database's password beside it); a Secret not made yet
// gives none, and without ConfigSecrets (a cluster) they are left out. It is
// a read of the app: a read-only token reads them, a user who may not use the
// app and a token limited to other apps are refused, and an app that does not
// exist is not found.
func TestConfigValues(t *testing.T) {
	ctx := context.Background()
	shop := deployed(app("shop", "bob"))
	shop.Spec.Env = []appv1.EnvVar{{Name: "API_KEY", Value: "sk-live-123456"}, {Name: "PORT_HINT", Value: "5000"},
		{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret("db"), Key: appv1.CredentialURL}},
		{Name: "REDIS_URL", ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret("cache"), Key: appv1.CredentialURL}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: appv1.CredentialsSecret("db"), Namespace: ns},
		Data: map[string][]byte{appv1.CredentialURL: []byte("postgres://shop:pw-0123456789@db:5432/shop"), appv1.CredentialPassword: []byte("pw-0123456789")}}
	withSecrets := newFixtureWith(t, func(c *backend.Config) { c.ConfigSecrets = c.Client }, shop.DeepCopy(), deployed(app("cart", "bob")), secret.DeepCopy())
	want := map[string]string{"API_KEY": "sk-live-123456", "PORT_HINT": "5000",
		"DATABASE_URL": "postgres://shop:pw-0123456789@db:5432/shop", "DATABASE_URL password": "pw-0123456789"}
	got, err := withSecrets.b.ConfigValues(ctx, member, "shop")
	if err != nil || !maps.Equal(got, want) {
		t.Errorf("ConfigValues with ConfigSecrets: %v %v, want %v", got, err, want)
	}
	ro := *member
	ro.Scope = backend.TokenScope{ReadOnly: true}
	if got, err := withSecrets.b.ConfigValues(ctx, &ro, "shop"); err != nil || !maps.Equal(got, want) {
		t.Errorf("a read-only token: %v %v", got, err)
	}

	without := newFixture(t, shop.DeepCopy(), secret.DeepCopy())
	got, err = without.b.ConfigValues(ctx, member, "shop")
	if want := map[string]string{"API_KEY": "sk-live-123456", "PORT_HINT": "5000"}; err != nil || !maps.Equal(got, want) {
		t.Errorf("ConfigValues without ConfigSecrets: %v %v, want %v", got, err, want)
	}

	_, err = withSecrets.b.ConfigValues(ctx, guest, "shop")
	wantKind(t, "a user who may not use the app", err, backend.Forbidden, "has no access to app shop")
	cartOnly := *member
	cartOnly.Scope = backend.TokenScope{Apps: []string{"cart"}}
	_, err = withSecrets.b.ConfigValues(ctx, &cartOnly, "shop")
	wantKind(t, "a token limited to cart", err, backend.Forbidden, "this token is limited to the apps cart")
	_, err = withSecrets.b.ConfigValues(ctx, member, "nope")
	wantKind(t, "an app that does not exist", err, backend.NotFound, `no app "nope"`)
}
