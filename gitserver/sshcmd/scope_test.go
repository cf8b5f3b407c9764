package sshcmd_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/tokens"
)

// TestScopedTokensOverSSH, with the real ssh client against the real
// gitserver on a real API server: tokens:create --apps and --read-only make
// tokens that verify with that scope (the backend then lists the token
// limited to shop that app only), tokens:create says what each may do, and
// tokens:list shows each token's scope, in its table and its --json. --apps
// naming an app bob may not use (another user's, one that does not exist, a
// name that is none, an empty one) is refused with one line, and no token
// is made. The control: a token made without them is of all apps.
func TestScopedTokensOverSSH(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)
	bob.ok("", "apps:create", "shop")
	bob.ok("", "apps:create", "cart")
	carol.ok("", "apps:create", "secret")

	made := map[string]string{}
	for name, args := range map[string][]string{
		"wide":    nil,
		"shop-ro": {"--apps", "shop", "--read-only", "--expires-in", "30d"},
		"both":    {"--apps", "shop,cart"},
		"reader":  {"--read-only"},
	} {
		out, errOut, code := bob.ssh("", append([]string{"tokens:create", name}, args...)...)
		if code != 0 || !tokens.WellFormed(strings.TrimSpace(out)) {
			t.Fatalf("tokens:create %s %v: exit %d, stdout %q, stderr %q", name, args, code, out, errOut)
		}
		made[name] = strings.TrimSpace(out)
		want := map[string]string{
			"wide":    "It does what " + bob.name + " may do, until ",
			"shop-ro": "It reads what " + bob.name + " may read of the apps shop, and changes nothing, until ",
			"both":    "It does what " + bob.name + " may do with the apps cart, shop, and nothing else, until ",
			"reader":  "It reads what " + bob.name + " may read, and changes nothing, until ",
		}[name]
		if !strings.Contains(errOut, want) {
			t.Errorf("tokens:create %s %v says %q, want %q", name, args, errOut, want)
		}
	}

	for apps, want := range map[string]string{
		"shop,secret": "--apps: user " + bob.name + " has no access to app secret",
		"nope":        `--apps: no app "nope": apps:list shows the apps you can use`,
		"Shop":        `--apps: "Shop" is not an app name`,
		"shop,":       `--apps: "" is not an app name`,
	} {
		bob.refused(want, "tokens:create", "refused", "--apps="+apps)
	}

	for name, scope := range map[string]backend.TokenScope{
		"wide": {}, "shop-ro": {Apps: []string{"shop"}, ReadOnly: true}, "both": {Apps: []string{"cart", "shop"}}, "reader": {ReadOnly: true},
	} {
		u, tok, err := s.b.VerifyToken(ctx, made[name])
		if err != nil || tok != name || !slices.Equal(u.Scope.Apps, scope.Apps) || u.Scope.ReadOnly != scope.ReadOnly {
			t.Errorf("VerifyToken of %s: %+v %q %v, want the scope %+v", name, u, tok, err, scope)
			continue
		}
		if name != "shop-ro" {
			continue
		}
		apps, err := s.b.Apps(ctx, u)
		if err != nil || len(apps) != 1 || apps[0].Name != "shop" {
			t.Errorf("the apps of the token limited to shop: %+v %v", apps, err)
		}
		if err := s.b.SetSuspended(ctx, u, "shop", true); !strings.Contains(err.Error(), "this token is read-only: suspend changes something") {
			t.Errorf("suspend by the read-only token: %v", err)
		}
	}

	out := bob.ok("", "tokens:list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !regexp.MustCompile(`^NAME\s+CREATED\s+EXPIRES\s+SCOPE\s+FINGERPRINT$`).MatchString(lines[0]) || len(lines) != 5 {
		t.Fatalf("tokens:list:\n%s", out)
	}
	for name, scope := range map[string]string{"both": "apps cart,shop", "reader": "read-only", "shop-ro": "apps shop, read-only", "wide": "all apps"} {
		row := regexp.MustCompile(`(?m)^` + name + `\s+\S+\s+\S+\s+` + regexp.QuoteMeta(scope) + `\s+SHA256:\S+$`)
		if !row.MatchString(out) {
			t.Errorf("tokens:list shows %s without its scope %q:\n%s", name, scope, out)
		}
	}
	var list []tokens.Token
	bob.json(&list, "tokens:list")
	got := map[string]string{}
	for _, tk := range list {
		got[tk.Name] = tk.Scope.String()
	}
	if len(got) != 4 || got["shop-ro"] != "apps shop, read-only" || got["both"] != "apps cart,shop" || got["reader"] != "read-only" || got["wide"] != "all apps" {
		t.Errorf("tokens:list --json: %+v", list)
	}
	if strings.Contains(out, "refused") {
		t.Errorf("a refused --apps made a token:\n%s", out)
	}
}
