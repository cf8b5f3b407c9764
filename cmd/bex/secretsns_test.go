package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/gitserver/webhook"
	"bex.co/bex/internal/testenv"
)

// TestGitserverSecretsNamespace: `bex gitserver --secrets-namespace` keeps the
// webhook secrets and the agents' tokens there and none among the apps' Secrets
// (the cluster's RBAC lets it touch no Secret of the apps' namespace); deliveries
// and bearer tokens verify against them, and apps:destroy deletes the app's
// webhook Secret, which no owner reference can reach from another namespace.
func TestGitserverSecretsNamespace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	secretsNS := testenv.SharedControlPlane(t).Namespace(t, "bex-system")
	e := startHooksEnv(t, ctx, "--secrets-namespace", secretsNS)
	c := e.cp.Client
	if err := c.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hooked", Namespace: e.ns},
		Spec: appv1.AppSpec{Git: appv1.GitSpec{DeployBranch: "prod"}}}); err != nil {
		t.Fatal(err)
	}
	appsSecrets := func() int {
		var l corev1.SecretList
		if err := c.List(ctx, &l, client.InNamespace(e.ns)); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}

	secret := strings.TrimSpace(e.ssh("webhooks:secret", "hooked"))
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "hooked-webhook"}, sec); err != nil {
		t.Fatalf("the webhook Secret is not in the secrets namespace: %v", err)
	}
	if len(sec.OwnerReferences) != 0 {
		t.Fatalf("an owner reference across namespaces: %+v", sec.OwnerReferences)
	}
	if info := e.ssh("webhooks", "hooked"); !strings.Contains(info, "Secret:        set") {
		t.Fatalf("webhooks hooked:\n%s", info)
	}
	if code, _ := e.deliver("hooked", "wrong", "d-1", strings.Repeat("1", 40)); code != http.StatusUnauthorized {
		t.Fatalf("wrong signature: %d", code)
	}
	// Signed right: verified, then ignored (main is not the deploy branch).
	if code, a := e.deliver("hooked", secret, "d-2", strings.Repeat("1", 40)); code != http.StatusAccepted || a.Result != webhook.ResultIgnored {
		t.Fatalf("signed delivery: %d %+v", code, a)
	}

	token := strings.TrimSpace(e.ssh("tokens:create", "agent"))
	var toks corev1.SecretList
	if err := c.List(ctx, &toks, client.InNamespace(secretsNS), client.MatchingLabels{tokens.LabelKind: tokens.KindToken}); err != nil || len(toks.Items) != 1 {
		t.Fatalf("token Secrets in the secrets namespace: %d %v", len(toks.Items), err)
	}
	s, err := mcpSession(t, ctx, e.hooksAddr, token)
	if err != nil {
		t.Fatalf("connect with the token: %v", err)
	}
	defer s.Close()
	var list mcpserver.AppList
	if res := call(t, ctx, s, "list_apps", nil, &list); res.IsError || len(list.Apps) != 1 || list.Apps[0].Name != "hooked" {
		t.Fatalf("list_apps: %s %+v", text(res), list)
	}
	if n := appsSecrets(); n != 0 {
		t.Fatalf("%d Secrets among the apps'", n)
	}

	e.ssh("apps:destroy", "hooked", "--confirm", "hooked")
	if err := c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "hooked-webhook"}, sec); !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook Secret outlives apps:destroy: %v", err)
	}
}
