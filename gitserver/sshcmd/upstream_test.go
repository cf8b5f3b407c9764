package sshcmd_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/upstream"
)

// TestUpstreamAddressesRefused: a member cannot point an upstream at this
// machine, the LAN or the metadata service, by address or by a name that
// resolves there; each refusal is one line. A public upstream is accepted.
func TestUpstreamAddressesRefused(t *testing.T) {
	f := newFixture(t, app("shop", "bob"), user("bob", appv1.RoleMember))
	for url, want := range map[string]string{
		"https://127.0.0.1:6443/x":             "127.0.0.1 is a loopback address",
		"http://10.0.0.1/x":                    `upstream "http://10.0.0.1/x": want https://`,
		"https://10.0.0.1/x":                   "10.0.0.1 is a private address",
		"https://100.64.0.7/x":                 "CGNAT",
		"https://[fd00::1]/x":                  "ULA",
		"https://169.254.169.254/latest/x":     "the cloud metadata address",
		"https://localhost:6443/x":             "localhost resolves to",
		"ssh://git@127.0.0.1:22/x.git":         "loopback",
		"git@192.168.0.2:team/x.git":           "private",
		"file:///srv/git/x.git":                "--allow-file-upstreams",
		"https://ci:hunter2@git.example.com/x": "--username USER --password-stdin",
		"https://ghp_token@git.example.com/x":  "--username USER --password-stdin",
	} {
		_, errOut, code := f.run(bob, "", "webhooks:upstream", "shop", url)
		if code == 0 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%s: exit %d, stderr %q; want one line with %q", url, code, errOut, want)
		}
		if strings.Contains(errOut, "hunter2") || strings.Contains(errOut, "ghp_token") {
			t.Errorf("%s: the refusal shows the credential: %q", url, errOut)
		}
	}
	if got := f.app("shop").Spec.Git.Upstream; got != "" {
		t.Fatalf("a refused upstream was set: %q", got)
	}
	// The controls: public upstreams (set without any network: a name that does
	// not resolve here is checked again at every fetch's dial).
	for _, url := range []string{"https://git.example.com/team/shop.git", "https://140.82.112.3/team/shop.git"} {
		if _, errOut, code := f.run(bob, "", "webhooks:upstream", "shop", url); code != 0 || f.app("shop").Spec.Git.Upstream != url {
			t.Fatalf("%s: exit %d %q", url, code, errOut)
		}
	}
	// An admin's setting lets a LAN git host be one.
	lan := newFixtureWith(t, func(c *backend.Config) { c.UpstreamPolicy = upstream.Policy{AllowPrivate: true} }, app("shop", "bob"), user("bob", appv1.RoleMember))
	if _, errOut, code := lan.run(bob, "", "webhooks:upstream", "shop", "https://10.0.0.1/team/shop.git"); code != 0 {
		t.Fatalf("with --allow-private-upstreams: exit %d %q", code, errOut)
	}
}

// TestUpstreamCredentialsAndDeployKey: credentials go in a Secret, never in the
// App, the output or the log; each app has its own deploy key, shown by
// webhooks, rotated by webhooks:deploy-key --rotate; apps:destroy removes both.
func TestUpstreamCredentialsAndDeployKey(t *testing.T) {
	const password = "s3cret-upstream-pw"
	f := newFixture(t, app("shop", "bob"), app("blog", "bob"), user("bob", appv1.RoleMember))
	out, errOut, code := f.run(bob, password+"\n", "webhooks:upstream", "shop", "https://git.example.com/team/shop.git", "--username", "ci", "--password-stdin")
	if code != 0 || !strings.Contains(out, "authenticates as ci") {
		t.Fatalf("set with credentials: %d %q %q", code, out, errOut)
	}
	ctx := context.Background()
	sec := &corev1.Secret{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-upstream"}, sec); err != nil {
		t.Fatal(err)
	}
	if string(sec.Data["username"]) != "ci" || string(sec.Data["password"]) != password || sec.Labels[appv1.LabelSecret] != "upstream-credentials" {
		t.Fatalf("the credentials' Secret: %v %v", sec.Labels, sec.Data)
	}
	if strings.Contains(f.app("shop").Spec.Git.Upstream, password) {
		t.Fatal("the password is in the App")
	}
	info, _, _ := f.run(bob, "", "webhooks", "shop")
	infoJSON, _, _ := f.run(bob, "", "webhooks", "shop", "--json")
	appInfo, _, _ := f.run(bob, "", "apps:info", "shop")
	appJSON, _, _ := f.run(bob, "", "apps:info", "shop", "--json")
	for _, s := range []string{info, infoJSON, appInfo, appJSON, f.log.String()} {
		if strings.Contains(s, password) {
			t.Fatalf("the password is shown or logged:\n%s", s)
		}
	}
	if !strings.Contains(info, "username ci (the password is kept, never shown)") {
		t.Fatalf("webhooks:\n%s", info)
	}
	// The flags go together, with https only; a new URL without them drops the
	// credentials, given for the old host.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"webhooks:upstream", "shop", "https://git.example.com/x", "--username", "ci"}, "go together"},
		{[]string{"webhooks:upstream", "shop", "ssh://git@git.example.com/x", "--username", "ci", "--password-stdin"}, "for https:// upstreams"},
	} {
		if _, errOut, code := f.run(bob, password, tc.args...); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: %d %q", tc.args, code, errOut)
		}
	}
	if _, _, code := f.run(bob, "", "webhooks:upstream", "shop", "https://elsewhere.example.com/x.git"); code != 0 {
		t.Fatal("new upstream")
	}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-upstream"}, sec); !apierrors.IsNotFound(err) {
		t.Fatalf("the credentials outlived their upstream: %v", err)
	}

	// Deploy keys: one per app, ed25519, the same when read again; an ssh
	// upstream prints it.
	out, _, code = f.run(bob, "", "webhooks:upstream", "shop", "git@git.example.com:team/shop.git")
	if code != 0 || !strings.Contains(out, "ssh-ed25519 ") {
		t.Fatalf("ssh upstream: %d %q", code, out)
	}
	var shop, blog backend.WebhookInfo
	out, _, _ = f.run(bob, "", "webhooks", "shop", "--json")
	_ = json.Unmarshal([]byte(out), &shop)
	out, _, _ = f.run(bob, "", "webhooks", "blog", "--json")
	_ = json.Unmarshal([]byte(out), &blog)
	if !strings.HasPrefix(shop.DeployKey, "ssh-ed25519 ") || shop.DeployKey == blog.DeployKey || blog.DeployKey == "" {
		t.Fatalf("deploy keys: shop %q blog %q", shop.DeployKey, blog.DeployKey)
	}
	out, _, code = f.run(bob, "", "webhooks:deploy-key", "shop")
	if code != 0 || strings.TrimSpace(out) != shop.DeployKey {
		t.Fatalf("webhooks:deploy-key: %d %q, want %q", code, out, shop.DeployKey)
	}
	out, errOut, code = f.run(bob, "", "webhooks:deploy-key", "shop", "--rotate")
	rotated := strings.TrimSpace(out)
	if code != 0 || rotated == shop.DeployKey || !strings.HasPrefix(rotated, "ssh-ed25519 ") || !strings.Contains(errOut, "the old one no longer fetches") {
		t.Fatalf("rotate: %d %q %q", code, out, errOut)
	}
	if _, _, _, _, err := gossh.ParseAuthorizedKey([]byte(rotated)); err != nil {
		t.Fatalf("the rotated key: %v", err)
	}
	if out, _, _ = f.run(bob, "", "webhooks:deploy-key", "shop"); strings.TrimSpace(out) != rotated {
		t.Fatalf("after the rotation: %q", out)
	}
	if !strings.Contains(f.log.String(), "command=webhooks:deploy-key") {
		t.Errorf("no audit line for the rotation:\n%s", f.log.String())
	}
	if _, errOut, code := f.run(carol, "", "webhooks:deploy-key", "shop", "--rotate"); code == 0 || !strings.Contains(errOut, "no access") {
		t.Fatalf("a non-member rotated: %d %q", code, errOut)
	}

	// apps:destroy takes the deploy key and the credentials with it.
	if _, _, code := f.run(bob, password, "webhooks:upstream", "shop", "https://git.example.com/x", "--username", "ci", "--password-stdin"); code != 0 {
		t.Fatal("credentials again")
	}
	if _, errOut, code := f.run(ana, "", "apps:destroy", "shop", "--confirm", "shop"); code != 0 {
		t.Fatalf("destroy: %q", errOut)
	}
	for _, name := range []string{"shop-deploy-key", "shop-upstream"} {
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s after apps:destroy: %v", name, err)
		}
	}
}
