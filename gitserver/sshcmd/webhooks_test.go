package sshcmd_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/gitserver/webhook"
	"bex.co/bex/internal/testenv"
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
	hook, err := f.b.Hook(context.Background(), "shop")
	if err != nil || len(hook.Secrets) != 1 || !webhook.Verify(webhook.GitHub, ghHeader([]byte(first), "{}"), []byte("{}"), hook.Secrets) {
		t.Fatalf("hook %+v %v", hook, err)
	}
	// The secret never reaches the log.
	if strings.Contains(f.log.String(), first) || !strings.Contains(f.log.String(), "command=webhooks:secret") {
		t.Fatalf("audit log:\n%s", f.log.String())
	}

	var rot backend.WebhookSecret
	out, _, code = f.run(bob, "", "webhooks:secret", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &rot); err != nil || code != 0 || rot.Secret == first || rot.PreviousValidUntil == nil ||
		rot.PreviousValidUntil.Sub(time.Now()) < 23*time.Hour {
		t.Fatalf("rotation: %d %s", code, out)
	}
	hook, _ = f.b.Hook(context.Background(), "shop")
	if len(hook.Secrets) != 2 {
		t.Fatalf("%d secrets valid during the rotation", len(hook.Secrets))
	}
	var info backend.WebhookInfo
	out, _, _ = f.run(bob, "", "webhooks", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &info); err != nil || !info.SecretSet || info.PreviousValidUntil == nil || info.Ref != "refs/heads/main" {
		t.Fatalf("webhooks --json: %s", out)
	}
	if out, _, code = f.run(bob, "", "webhooks:secret", "shop", "--drop-previous"); code != 0 || !strings.Contains(out, "no longer verifies") {
		t.Fatalf("--drop-previous: %d %s", code, out)
	}
	hook, _ = f.b.Hook(context.Background(), "shop")
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
	// apps:destroy takes the Secret along (no garbage collector acts on its owner
	// reference under bex up).
	if out, _, code = f.run(bob, "", "apps:destroy", "shop", "--confirm", "shop"); code != 0 {
		t.Fatalf("apps:destroy: %d %s", code, out)
	}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shop-webhook"}, sec); !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook Secret outlives apps:destroy: %v", err)
	}
}

// TestWebhookSecretsNamespace: with a secrets namespace of its own (bex-system on
// a cluster), the webhook Secret is made there, without an owner reference, the
// commands and the handler's lookup find it there, nothing is written among the
// apps' Secrets, and apps:destroy deletes it.
func TestWebhookSecretsNamespace(t *testing.T) {
	const secretsNS = "bex-system"
	f := newFixtureWith(t, func(c *backend.Config) { c.SecretsNamespace = secretsNS }, app("shop", "bob"), user("bob", appv1.RoleMember))
	ctx := context.Background()
	out, _, code := f.run(bob, "", "webhooks:secret", "shop")
	first := strings.TrimSpace(out)
	if code != 0 || len(first) != 64 {
		t.Fatalf("webhooks:secret: %d %q", code, out)
	}
	sec := &corev1.Secret{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "shop-webhook"}, sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.OwnerReferences) != 0 {
		t.Fatalf("an owner reference across namespaces: %+v", sec.OwnerReferences)
	}
	var all corev1.SecretList
	if err := f.c.List(ctx, &all, client.InNamespace(ns)); err != nil || len(all.Items) != 0 {
		t.Fatalf("Secrets among the apps': %d %v", len(all.Items), err)
	}
	if a := f.app("shop"); a.Spec.Git.WebhookSecretRef == nil || a.Spec.Git.WebhookSecretRef.Name != "shop-webhook" {
		t.Fatalf("ref %+v", a.Spec.Git.WebhookSecretRef)
	}
	if hook, err := f.b.Hook(ctx, "shop"); err != nil || len(hook.Secrets) != 1 || string(hook.Secrets[0]) != first {
		t.Fatalf("hook %+v %v", hook, err)
	}
	if out, _, code = f.run(bob, "", "webhooks:secret", "shop"); code != 0 {
		t.Fatalf("rotation: %d %s", code, out)
	}
	var info backend.WebhookInfo
	out, _, _ = f.run(bob, "", "webhooks", "shop", "--json")
	if err := json.Unmarshal([]byte(out), &info); err != nil || !info.SecretSet || info.PreviousValidUntil == nil {
		t.Fatalf("webhooks --json: %s", out)
	}
	if out, _, code = f.run(bob, "", "webhooks:secret", "shop", "--drop-previous"); code != 0 {
		t.Fatalf("--drop-previous: %d %s", code, out)
	}
	if out, _, code = f.run(bob, "", "apps:destroy", "shop", "--confirm", "shop"); code != 0 {
		t.Fatalf("apps:destroy: %d %s", code, out)
	}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: secretsNS, Name: "shop-webhook"}, sec); !apierrors.IsNotFound(err) {
		t.Fatalf("the webhook Secret outlives apps:destroy: %v", err)
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
	// bob signs in with a key he has: a token works while its key is there.
	key := testenv.NewSSHKey(t)
	f = newFixtureWith(t, func(c *backend.Config) {
		c.Tokens = &tokens.Store{Client: c.Client, Users: c.Client, Namespace: "bex-system"}
		c.HooksURL = "https://bex.test"
	},
		user("bob", appv1.RoleMember, key.AuthorizedKey))
	f.fp = gossh.FingerprintSHA256(key.Signer.PublicKey())
	out, errOut, code := f.run(bob, "", "tokens:create", "agent")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "bex_") || !strings.Contains(errOut, "https://bex.test/mcp") {
		t.Fatalf("tokens:create: %d %q %q", code, out, errOut)
	}
	if strings.Contains(f.log.String(), tok) || !strings.Contains(f.log.String(), "command=tokens:create") {
		t.Fatalf("audit:\n%s", f.log.String())
	}
	if !strings.Contains(errOut, "It does what bob may do, until 20") {
		t.Errorf("tokens:create does not say when the token ends (default %s): %q", backend.DefaultTokenTTL, errOut)
	}
	if _, errOut, code = f.run(bob, "", "tokens:create", "agent"); code != 1 || !strings.Contains(errOut, "has a token named agent already") {
		t.Fatalf("twice: %d %s", code, errOut)
	}
	if _, errOut, code = f.run(bob, "", "tokens:create", "other", "--expires-in", "forever"); code != 1 ||
		!strings.Contains(errOut, `--expires-in "forever": want a duration such as 90d, 12h or 30m, or never`) {
		t.Fatalf("--expires-in forever: %d %s", code, errOut)
	}
	if out, _, code = f.run(bob, "", "tokens:create", "kept", "--expires-in", "never", "--json"); code != 0 || strings.Contains(out, "expires") {
		t.Fatalf("--expires-in never: %d %s", code, out)
	}
	if out, _, _ = f.run(bob, "", "tokens:list"); !strings.Contains(out, "EXPIRES") || !strings.Contains(out, "never") ||
		!strings.Contains(out, "FINGERPRINT") || !strings.Contains(out, f.fp) || strings.Contains(out, "refused") {
		t.Fatalf("tokens:list: %s", out)
	}
	f.run(bob, "", "tokens:revoke", "kept")
	var list []tokens.Token
	out, _, _ = f.run(bob, "", "tokens:list", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "agent" || list[0].User != "bob" ||
		list[0].Fingerprint != f.fp || !strings.Contains(out, `"fingerprint": "`+f.fp+`"`) {
		t.Fatalf("tokens:list --json: %s", out)
	}
	// A token as an earlier bex made it (no UID): listed as refused, saying why.
	var secs corev1.SecretList
	if err := f.c.List(context.Background(), &secs, client.MatchingLabels{tokens.LabelName: "agent"}); err != nil || len(secs.Items) != 1 {
		t.Fatalf("agent's Secret: %v", err)
	}
	delete(secs.Items[0].Labels, tokens.LabelUserUID)
	if err := f.c.Update(context.Background(), &secs.Items[0]); err != nil {
		t.Fatal(err)
	}
	if out, _, _ = f.run(bob, "", "tokens:list"); !strings.Contains(out, "refused") ||
		!strings.Contains(out, "Token agent is refused: made before tokens were bound to their user: tokens:create makes a new one") {
		t.Fatalf("tokens:list of a token made before the binding: %s", out)
	}
	if out, _, code = f.run(bob, "", "tokens:revoke", "agent"); code != 0 || !strings.Contains(out, "Revoked token agent") {
		t.Fatalf("tokens:revoke: %d %s", code, out)
	}
	if _, errOut, code = f.run(bob, "", "tokens:revoke", "agent"); code != 1 || !strings.Contains(errOut, `no token named "agent"`) {
		t.Fatalf("revoke twice: %d %s", code, errOut)
	}
}

// webhooks:upstream sets and unsets spec.git.upstream, refuses what the gitserver
// cannot fetch in one line, and keeps others out of the app.
func TestWebhookUpstream(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), app("secret", "carol"), user("bob", appv1.RoleMember))
	out, errOut, code := f.run(bob, "", "webhooks:upstream", "shop", "https://git.example.com/team/shop.git")
	if code != 0 || !strings.Contains(out, "fetches https://git.example.com/team/shop.git") || !strings.Contains(errOut, "no webhook secret yet") {
		t.Fatalf("set: %d %q %q", code, out, errOut)
	}
	if got := f.app("shop").Spec.Git.Upstream; got != "https://git.example.com/team/shop.git" {
		t.Fatalf("upstream %q", got)
	}
	if !strings.Contains(f.log.String(), "command=webhooks:upstream") {
		t.Errorf("no audit line:\n%s", f.log.String())
	}
	// Setting it again changes nothing and succeeds.
	if _, _, code := f.run(bob, "", "webhooks:upstream", "shop", "https://git.example.com/team/shop.git"); code != 0 {
		t.Fatalf("the same upstream again: exit %d", code)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"webhooks:upstream", "shop", "http://git.example.com/shop"}, `upstream "http://git.example.com/shop": want https://`},
		{[]string{"webhooks:upstream", "shop", "https://x y"}, "want https://"},
		{[]string{"webhooks:upstream", "shop"}, "give a URL"},
		{[]string{"webhooks:upstream", "shop", "https://a/b", "--unset"}, "give a URL"},
		{[]string{"webhooks:upstream", "secret", "https://a/b"}, "no access"},
	} {
		_, errOut, code := f.run(bob, "", tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
	out, _, code = f.run(bob, "", "webhooks:upstream", "shop", "--unset")
	if code != 0 || !strings.Contains(out, "rebuilds its current commit") || f.app("shop").Spec.Git.Upstream != "" {
		t.Fatalf("unset: %d %q, upstream %q", code, out, f.app("shop").Spec.Git.Upstream)
	}
}
