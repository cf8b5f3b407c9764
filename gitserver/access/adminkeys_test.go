package access_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

func TestEnsureAdmin(t *testing.T) {
	e := newEnv(t, "admin", nil)
	ctx := context.Background()
	c := e.cp.Client
	name := e.name("root")
	key, line := newKey(t)

	changed, err := backend.EnsureAdmin(ctx, c, name, []byte(line+"\n"))
	if err != nil || !changed {
		t.Fatalf("first EnsureAdmin: changed %v, err %v", changed, err)
	}
	testenv.Eventually(t, 10*time.Second, "the admin key", e.userIs(key, backend.User{Name: name, Admin: true, CanCreateApps: true, KeyName: "test@bex"}))

	// Starting again with the same key changes nothing.
	if changed, err := backend.EnsureAdmin(ctx, c, name, []byte(line)); err != nil || changed {
		t.Fatalf("second EnsureAdmin: changed %v, err %v", changed, err)
	}

	// A demoted admin with another key is promoted again and gets the key added,
	// under a name that does not clash.
	other, otherLine := newKey(t)
	var u appv1.User
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &u); err != nil {
		t.Fatal(err)
	}
	u.Spec.Role = appv1.RoleMember
	if err := c.Update(ctx, &u); err != nil {
		t.Fatal(err)
	}
	if changed, err := backend.EnsureAdmin(ctx, c, name, []byte(otherLine)); err != nil || !changed {
		t.Fatalf("EnsureAdmin of a new key: changed %v, err %v", changed, err)
	}
	testenv.Eventually(t, 10*time.Second, "the second key", e.userIs(other, backend.User{Name: name, Admin: true, CanCreateApps: true, KeyName: "test@bex-2"}))

	for _, bad := range []string{"", "not a key", line + "\n" + otherLine} {
		if _, err := backend.EnsureAdmin(ctx, c, name, []byte(bad)); err == nil {
			t.Errorf("EnsureAdmin(%q) accepted it", bad)
		}
	}
}

func TestEnsureAdminKeys(t *testing.T) {
	e := newEnv(t, "adminkeys", nil)
	ctx := context.Background()
	name := e.name("ops")
	k1, l1 := newKey(t)
	k2, l2 := newKey(t)
	file := []byte("# the team\n" + l1 + "\n\n  " + l2 + "  \n")
	if n, err := backend.EnsureAdminKeys(ctx, e.cp.Client, name, file); err != nil || n != 2 {
		t.Fatalf("EnsureAdminKeys = %d, %v; want 2 keys added", n, err)
	}
	for _, k := range []gossh.PublicKey{k1, k2} {
		testenv.Eventually(t, 10*time.Second, "an admin key", func() error {
			u, err := e.dir.UserByKey(ctx, k)
			if err != nil || u.Name != name || !u.Admin {
				return fmt.Errorf("%+v %v", u, err)
			}
			return nil
		})
	}
	if n, err := backend.EnsureAdminKeys(ctx, e.cp.Client, name, file); err != nil || n != 0 {
		t.Fatalf("EnsureAdminKeys again = %d, %v; want nothing changed", n, err)
	}
	if ok, err := backend.HasAdmin(ctx, e.cp.Client); err != nil || !ok {
		t.Fatalf("HasAdmin = %v, %v", ok, err)
	}
	if _, err := backend.EnsureAdminKeys(ctx, e.cp.Client, name, []byte(l1+"\nnot a key\n")); err == nil {
		t.Fatal("a file with a line that is no key was accepted")
	}
}
