package access_test

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
)

func TestEnsureAdmin(t *testing.T) {
	e := newEnv(t, "admin", nil)
	ctx := context.Background()
	c := e.cp.Client
	name := e.name("root")
	key, line := newKey(t)

	changed, err := access.EnsureAdmin(ctx, c, name, []byte(line+"\n"))
	if err != nil || !changed {
		t.Fatalf("first EnsureAdmin: changed %v, err %v", changed, err)
	}
	eventually(t, "the admin key", e.userIs(key, gitserver.User{Name: name, Admin: true, CanCreateApps: true, KeyName: "test@bex"}))

	// Starting again with the same key changes nothing.
	if changed, err := access.EnsureAdmin(ctx, c, name, []byte(line)); err != nil || changed {
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
	if changed, err := access.EnsureAdmin(ctx, c, name, []byte(otherLine)); err != nil || !changed {
		t.Fatalf("EnsureAdmin of a new key: changed %v, err %v", changed, err)
	}
	eventually(t, "the second key", e.userIs(other, gitserver.User{Name: name, Admin: true, CanCreateApps: true, KeyName: "test@bex-2"}))

	for _, bad := range []string{"", "not a key", line + "\n" + otherLine} {
		if _, err := access.EnsureAdmin(ctx, c, name, []byte(bad)); err == nil {
			t.Errorf("EnsureAdmin(%q) accepted it", bad)
		}
	}
}
