package backend

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	gossh "golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// EnsureAdmin makes user an admin holding the OpenSSH public key authorizedKey
// (one authorized_keys line), creating the User when missing. It is idempotent: run
// on every start of `bex up --admin-key`, it changes nothing once the key is there,
// and it reports whether it changed anything. The key is named after its comment
// when that is a valid key name, else "admin".
func EnsureAdmin(ctx context.Context, c client.Client, user string, authorizedKey []byte) (changed bool, err error) {
	pk, comment, _, rest, err := gossh.ParseAuthorizedKey(authorizedKey)
	if err != nil {
		return false, fmt.Errorf("admin key: not an OpenSSH public key (the contents of a .pub file): %w", err)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return false, fmt.Errorf("admin key: one key per file, found more")
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk)))
	key := appv1.SSHKey{Name: keyName(comment), PublicKey: line}

	u := &appv1.User{}
	err = c.Get(ctx, client.ObjectKey{Name: user}, u)
	if apierrors.IsNotFound(err) {
		u.Name = user
		u.Spec = appv1.UserSpec{Role: appv1.RoleAdmin, CanCreateApps: true, Keys: []appv1.SSHKey{key}}
		if err := c.Create(ctx, u); err != nil {
			return false, fmt.Errorf("creating admin user %s: %w", user, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading user %s: %w", user, err)
	}
	before := u.DeepCopy()
	u.Spec.Role = appv1.RoleAdmin
	held := false
	for _, k := range u.Spec.Keys {
		if existing, err := PublicKeyOf(k.PublicKey); err == nil && bytes.Equal(existing.Marshal(), pk.Marshal()) {
			held = true
			break
		}
	}
	if !held {
		key.Name = uniqueKeyName(u.Spec.Keys, key.Name)
		u.Spec.Keys = append(u.Spec.Keys, key)
	}
	if held && before.Spec.Role == appv1.RoleAdmin {
		return false, nil
	}
	if err := c.Patch(ctx, u, client.MergeFrom(before)); err != nil {
		return false, fmt.Errorf("making %s an admin: %w", user, err)
	}
	return true, nil
}

// keyName turns a key comment ("me@laptop") into a key name, or "admin".
func keyName(comment string) string {
	var b strings.Builder
	for _, r := range comment {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.', r == '@':
			b.WriteRune(r)
		}
	}
	name := strings.TrimLeft(b.String(), "-_.@")
	if name == "" || len(name) > 63 {
		return "admin"
	}
	return name
}

func uniqueKeyName(keys []appv1.SSHKey, name string) string {
	taken := map[string]bool{}
	for _, k := range keys {
		taken[k.Name] = true
	}
	for i, n := 2, name; ; i++ {
		if !taken[n] {
			return n
		}
		n = fmt.Sprintf("%s-%d", name, i)
	}
}

// EnsureAdminKeys is EnsureAdmin for every key of authorizedKeys, in
// authorized_keys form (one key a line; blank lines and # comments skipped). It
// returns how many keys were added or made admin.
func EnsureAdminKeys(ctx context.Context, c client.Client, user string, authorizedKeys []byte) (changed int, err error) {
	for _, line := range bytes.Split(authorizedKeys, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		ch, err := EnsureAdmin(ctx, c, user, line)
		if err != nil {
			return changed, err
		}
		if ch {
			changed++
		}
	}
	return changed, nil
}

// HasAdmin reports whether some admin holds a key, so that a server can say how to
// add the first one.
func HasAdmin(ctx context.Context, c client.Reader) (bool, error) {
	var users appv1.UserList
	if err := c.List(ctx, &users); err != nil {
		return false, err
	}
	for _, u := range users.Items {
		if u.Spec.Role == appv1.RoleAdmin && len(u.Spec.Keys) > 0 {
			return true, nil
		}
	}
	return false, nil
}
