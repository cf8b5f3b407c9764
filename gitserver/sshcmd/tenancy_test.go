package sshcmd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestDomainsOfOthersAndThePlatform, with the real ssh client against the real
// gitserver on a real API server: a member cannot take another app's host
// under the base domain (<app>.<base>), a name under it (login.<app>.<base>),
// their own app's, the base domain, a name of the base domain's registered
// domain, or a name under another tenant's custom domain; each refusal is one
// line saying what to do. The controls: an ordinary custom domain is
// accepted, a member may add names under a domain of an app they are a
// member of too, and an admin may add a name under the base domain.
func TestDomainsOfOthersAndThePlatform(t *testing.T) {
	s := newServer(t)
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)

	carol.ok("", "apps:create", "shopfront")
	carol.ok("", "domains:add", "shopfront", "shopfront.example.org") // the control: an ordinary custom domain
	bob.ok("", "apps:create", "shop")
	for _, d := range []string{"shopfront." + baseDomain, "login.shopfront." + baseDomain, "login.shop." + baseDomain, baseDomain} {
		bob.refused(d+" is the platform's name (apps answer at APP."+baseDomain+" on their own): add a domain of yours", "domains:add", "shop", d)
	}
	bob.refused("www.bex.test shares bex.test with the platform's names", "domains:add", "shop", "www.bex.test")
	bob.refused("login.shopfront.example.org is under shopfront.example.org, a domain of another app: only its members (or an admin) may add names under it",
		"domains:add", "shop", "login.shopfront.example.org")

	// The controls.
	bob.ok("", "domains:add", "shop", "www.bobs-shop.example.net")
	admin.ok("", "access:add", "shopfront", bob.name)
	bob.ok("", "domains:add", "shop", "api.shopfront.example.org") // bob is a member of shopfront now
	admin.ok("", "domains:add", "shop", "status."+baseDomain)
	if got := s.app("shop").Spec.Domains; !slices.Equal(got, []string{"www.bobs-shop.example.net", "api.shopfront.example.org", "status." + baseDomain}) {
		t.Fatalf("shop's domains: %v", got)
	}
	if got := s.app("shopfront").Spec.Domains; !slices.Equal(got, []string{"shopfront.example.org"}) {
		t.Fatalf("shopfront's domains: %v", got)
	}
}

// TestKeysRemoveEndsItsTokens, with the real ssh client: bob makes a token
// with each of his two keys; keys:remove of one says it revoked its token,
// which is refused from then on, while the other key's token works (the
// control). A key taken out of the User straight through the API (as if
// keys:remove had stopped before it deleted the tokens) ends its token too:
// verification asks for the key.
func TestKeysRemoveEndsItsTokens(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, true)
	ciKey := testenv.NewSSHKey(t)
	admin.ok(ciKey.AuthorizedKey, "keys:add", "ci", "--user", bob.name)
	bobCI := &sshUser{s: s, name: bob.name, key: ciKey}
	s.eventually(func() error { _, err := s.dir.UserByKey(ctx, ciKey.Signer.PublicKey()); return err })

	laptopToken := strings.TrimSpace(bob.ok("", "tokens:create", "from-laptop"))
	ciToken := strings.TrimSpace(bobCI.ok("", "tokens:create", "from-ci"))
	for _, tok := range []string{laptopToken, ciToken} {
		if _, _, err := s.b.VerifyToken(ctx, tok); err != nil {
			t.Fatalf("a token before keys:remove: %v", err)
		}
	}

	if out := bobCI.ok("", "keys:remove", "laptop"); !strings.Contains(out, "the tokens made with it (1) are revoked") {
		t.Fatalf("keys:remove: %q", out)
	}
	if _, _, err := s.b.VerifyToken(ctx, laptopToken); err == nil {
		t.Fatal("the token of the removed key still works")
	}
	if u, name, err := s.b.VerifyToken(ctx, ciToken); err != nil || u.Name != bob.name || name != "from-ci" {
		t.Fatalf("the token of the key that stays (the control): %v", err)
	}
	if out := bobCI.ok("", "tokens:list"); strings.Contains(out, "from-laptop") || !strings.Contains(out, "from-ci") {
		t.Fatalf("tokens:list after keys:remove:\n%s", out)
	}

	// The ci key taken out behind the gitserver's back: its token stays
	// stored, and is refused once the gitserver's cache has the User without
	// the key.
	u := &appv1.User{}
	if err := s.cp.Client.Get(ctx, client.ObjectKey{Name: bob.name}, u); err != nil {
		t.Fatal(err)
	}
	u.Spec.Keys = slices.DeleteFunc(u.Spec.Keys, func(k appv1.SSHKey) bool { return k.Name == "ci" })
	if err := s.cp.Client.Update(ctx, u); err != nil {
		t.Fatal(err)
	}
	s.eventually(func() error {
		_, _, err := s.b.VerifyToken(ctx, ciToken)
		if err == nil {
			return errors.New("the token of the key taken out still works")
		}
		if !strings.Contains(err.Error(), "made with a key removed since") {
			return err
		}
		return nil
	})
}

// TestABurstOfCommandsFromOneAddress: 20 `ssh ... apps:list --json` at once
// from 127.0.0.1 (a CI job, a team behind one NAT), with the gitserver's
// default limits (10 unauthenticated connections per source): all succeed,
// those past the limit waiting for a slot. Three rounds.
func TestABurstOfCommandsFromOneAddress(t *testing.T) {
	s := newServer(t)
	bob := s.addUser("bob", appv1.RoleMember, true)
	bob.ok("", "apps:create", "shop")
	for round := range 3 {
		start := time.Now()
		errs := make([]string, 20)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				out, errOut, code := bob.ssh("", "apps:list", "--json")
				if code != 0 || !strings.Contains(out, `"shop"`) {
					errs[i] = fmt.Sprintf("exit %d, stdout %q, stderr %q", code, out, errOut)
				}
			})
		}
		wg.Wait()
		failed := 0
		for i, e := range errs {
			if e != "" {
				failed++
				t.Errorf("round %d, command %d: %s", round+1, i+1, e)
			}
		}
		t.Logf("round %d: 20 commands at once, %d failed, %s", round+1, failed, time.Since(start))
	}
}
