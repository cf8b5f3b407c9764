package sshcmd_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/agentapi/tokens"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/sshcmd"
	"bex.co/bex/webhook"
	"bex.co/bex/webhook/secrets"
)

func TestWebhooks(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), app("secret", "carol"), user("bob", appv1.RoleMember))
	out, _, code := f.run(bob, "", "webhooks", "shop")
	if code != 0 || !strings.Contains(out, "not set: webhooks:secret shop makes one") || !strings.Contains(out, "pushes to refs/heads/main") ||
		!strings.Contains(out, "this server serves no webhooks") {
		t.Fatalf("webhooks before a secret:\n%s", out)
	}

	out, errOut, code := f.run(bob, "", "webhooks:secret", "shop")
	first := strings.TrimSpace(out)
	if code != 0 || len(first) != 64 || !strings.Contains(errOut, "shown this once") {
		t.Fatalf("webhooks:secret: %d %q %q", code, out, errOut)
	}
	a := f.app("shop")
	if ref := a.Spec.Git.WebhookSecretRef; ref == nil || ref.Name != "shop-webhook" || ref.Key != "secret" {
		t.Fatalf("ref %+v", a.Spec.Git.WebhookSecretRef)
	}
	// The handler's lookup verifies with it.
	store := &secrets.Store{Apps: f.c, Secrets: f.c, Namespace: ns}
	hook, err := store.Hook(context.Background(), "shop")
	if err != nil || len(hook.Secrets) != 1 || !webhook.Verify(webhook.GitHub, ghHeader([]byte(first), "{}"), []byte("{}"), hook.Secrets) {
		t.Fatalf("hook %+v %v", hook, err)
	}
	// The secret never reaches the log.
	if strings.Contains(f.log.String(), first) || !strings.Contains(f.log.String(), "command=webhooks:secret") {
		t.Fatalf("audit log:\n%s", f.log.String())
	}

	var rot sshcmd.WebhookSecret
	out, _, code = f.run(bob, "", "webhooks:secret", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &rot); err != nil || code != 0 || rot.Secret == first || rot.PreviousValidUntil == nil ||
		rot.PreviousValidUntil.Sub(time.Now()) < 23*time.Hour {
		t.Fatalf("rotation: %d %s", code, out)
	}
	hook, _ = store.Hook(context.Background(), "shop")
	if len(hook.Secrets) != 2 {
		t.Fatalf("%d secrets valid during the rotation", len(hook.Secrets))
	}
	var info sshcmd.WebhookInfo
	out, _, _ = f.run(bob, "", "webhooks", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &info); err != nil || !info.SecretSet || info.PreviousValidUntil == nil || info.Ref != "refs/heads/main" {
		t.Fatalf("webhooks --json: %s", out)
	}
	if out, _, code = f.run(bob, "", "webhooks:secret", "shop", "--drop-previous"); code != 0 || !strings.Contains(out, "no longer verifies") {
		t.Fatalf("--drop-previous: %d %s", code, out)
	}
	hook, _ = store.Hook(context.Background(), "shop")
	if len(hook.Secrets) != 1 || string(hook.Secrets[0]) != rot.Secret {
		t.Fatalf("after --drop-previous: %q", hook.Secrets)
	}
	if _, errOut, code = f.run(bob, "", "webhooks:secret", "shop", "--drop-previous"); code != 1 || !strings.Contains(errOut, "no previous webhook secret") {
		t.Fatalf("--drop-previous twice: %d %s", code, errOut)
	}
	sec := &corev1.Secret{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop-webhook"}, sec); err != nil {
		t.Fatal(err)
	}
	// Same access rules as every app command.
	if _, errOut, code = f.run(bob, "", "webhooks:secret", "secret"); code != 1 || !strings.Contains(errOut, "has no access to app secret") {
		t.Fatalf("another's app: %d %s", code, errOut)
	}
}

func ghHeader(secret []byte, body string) http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderGitHubSignature, webhook.Sign(secret, []byte(body)))
	return h
}

func TestTokens(t *testing.T) {
	f := newFixture(t, user("bob", appv1.RoleMember))
	_, errOut, code := f.run(bob, "", "tokens:list")
	if code != 1 || !strings.Contains(errOut, "no agents' API") {
		t.Fatalf("without a store: %d %s", code, errOut)
	}
	f = newFixtureWith(t, func(c *sshcmd.Config) {
		c.Tokens = &tokens.Store{Client: c.Client, Users: c.Client, Namespace: ns}
		c.HooksURL = "https://bex.test"
	},
		user("bob", appv1.RoleMember))
	out, errOut, code := f.run(bob, "", "tokens:create", "agent")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "bex_") || !strings.Contains(errOut, "https://bex.test/mcp") {
		t.Fatalf("tokens:create: %d %q %q", code, out, errOut)
	}
	if strings.Contains(f.log.String(), tok) || !strings.Contains(f.log.String(), "command=tokens:create") {
		t.Fatalf("audit:\n%s", f.log.String())
	}
	if _, errOut, code = f.run(bob, "", "tokens:create", "agent"); code != 1 || !strings.Contains(errOut, "has a token named agent already") {
		t.Fatalf("twice: %d %s", code, errOut)
	}
	var list []sshcmd.TokenInfo
	out, _, _ = f.run(bob, "", "tokens:list", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "agent" || list[0].User != "bob" {
		t.Fatalf("tokens:list --json: %s", out)
	}
	if out, _, code = f.run(bob, "", "tokens:revoke", "agent"); code != 0 || !strings.Contains(out, "Revoked token agent") {
		t.Fatalf("tokens:revoke: %d %s", code, out)
	}
	if _, errOut, code = f.run(bob, "", "tokens:revoke", "agent"); code != 1 || !strings.Contains(errOut, `no token named "agent"`) {
		t.Fatalf("revoke twice: %d %s", code, errOut)
	}
}
