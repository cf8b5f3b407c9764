package hooksecrets_test

import (
	"context"
	"testing"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/hooksecrets"
)

// TestUpstreamSecretsBelongToOneApp: the deploy key and credentials left by an
// app of the same name (destroyed without apps:destroy) are not the new app's:
// its key is a new one, the old credentials are not used.
func TestUpstreamSecretsBelongToOneApp(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	old := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps", UID: "old"}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(old).Build()
	ctx := context.Background()
	st := &hooksecrets.Upstreams{Client: c, Namespace: "apps", SecretsNamespace: "bex-system"}
	oldKey, err := st.DeployKey(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetCredentials(ctx, old, "ci", "pw"); err != nil {
		t.Fatal(err)
	}
	if u, p, ok, err := st.Credentials(ctx, "shop"); err != nil || !ok || u != "ci" || p != "pw" {
		t.Fatalf("credentials: %q %q %v %v", u, p, ok, err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "bex-system", Name: "shop-deploy-key"}, sec); err != nil || sec.Type != corev1.SecretTypeSSHAuth || len(sec.OwnerReferences) != 0 {
		t.Fatalf("the deploy key's Secret: %v %+v", err, sec)
	}

	// The App goes without apps:destroy; one of the same name is made.
	if err := c.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "apps", UID: "new"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := st.Credentials(ctx, "shop"); err != nil || ok {
		t.Fatalf("the old app's credentials are used: %v %v", ok, err)
	}
	newKey, err := st.DeployKey(ctx, "shop")
	if err != nil || string(newKey.PublicKey().Marshal()) == string(oldKey.PublicKey().Marshal()) {
		t.Fatalf("the new app has the old app's deploy key (%v)", err)
	}
	// The control: read again, the new app's key stays.
	again, _ := st.DeployKey(ctx, "shop")
	if again == nil || gossh.FingerprintSHA256(again.PublicKey()) != gossh.FingerprintSHA256(newKey.PublicKey()) {
		t.Fatal("the deploy key changed when read again")
	}
}
