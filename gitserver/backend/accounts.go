package backend

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	gossh "golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// MaxKeyBytes bounds what keys:add reads: one public key is well under it.
const MaxKeyBytes = 16 << 10

// keysOf is whose keys u works on (the operation op): u's own when user is
// empty or u's name, another user's for admins only; neither through a
// limited token.
func keysOf(u *User, user, op string) (string, error) {
	if err := u.unlimited(op); err != nil {
		return "", err
	}
	if user == "" || user == u.Name {
		return u.Name, nil
	}
	if err := requireAdmin(u, "--user"); err != nil {
		return "", err
	}
	return user, nil
}

// AddKey gives user (u when empty; another user for admins) the public key read
// from r, at most MaxKeyBytes, under name. It returns the key's fingerprint and
// whose key it became.
func (b *Backend) AddKey(ctx context.Context, u *User, user, name string, r io.Reader) (fingerprint, owner string, err error) {
	if err := u.mayChange("keys:add"); err != nil {
		return "", "", err
	}
	owner, err = keysOf(u, user, "keys:add")
	if err != nil {
		return "", "", err
	}
	text, err := io.ReadAll(io.LimitReader(r, MaxKeyBytes+1))
	if err != nil {
		return "", "", err
	}
	if len(text) > MaxKeyBytes {
		return "", "", Errorf(Invalid, "stdin holds more than %d bytes: send one public key (the .pub file)", MaxKeyBytes)
	}
	if len(strings.TrimSpace(string(text))) == 0 {
		return "", "", Errorf(Invalid, "no key on stdin: ssh bex@HOST keys:add %s < ~/.ssh/id_ed25519.pub", name)
	}
	if _, _, err := ParseKey(text); err != nil {
		return "", "", err
	}
	fp, err := AddKey(ctx, b.cfg.Client, owner, name, text)
	if err != nil {
		return "", "", err
	}
	b.audit(u, "keys:add", "", "for", owner, "keyName", name, "added", fp)
	return fp, owner, nil
}

// Keys lists the SSH keys of user (u when empty; another user for admins).
func (b *Backend) Keys(ctx context.Context, u *User, user string) ([]KeyInfo, error) {
	owner, err := keysOf(u, user, "keys")
	if err != nil {
		return nil, err
	}
	au := &appv1.User{}
	if err := b.cfg.Reader.Get(ctx, client.ObjectKey{Name: owner}, au); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, Errorf(NotFound, "no user %q (users:list shows them)", owner)
		}
		return nil, err
	}
	out := []KeyInfo{}
	for _, k := range au.Spec.Keys {
		ki := KeyInfo{Name: k.Name}
		if pk, comment, _, _, err := gossh.ParseAuthorizedKey([]byte(k.PublicKey)); err == nil {
			ki.Type, ki.Fingerprint, ki.Comment = pk.Type(), gossh.FingerprintSHA256(pk), comment
			ki.Current = owner == u.Name && ki.Fingerprint == u.KeyFingerprint
		} else {
			ki.Type = "invalid"
		}
		out = append(out, ki)
	}
	return out, nil
}

// RemoveKey removes a key of user (u when empty; another user for admins) by
// name or fingerprint; its open sessions close (the gitserver re-checks them)
// and the tokens made in its sessions are deleted. It returns the key's name,
// whose it was and how many tokens went with it. The tokens go after the key:
// were their deletion to fail, they verify no more anyway (a token verifies
// only while its User has the key that made it).
func (b *Backend) RemoveKey(ctx context.Context, u *User, user, nameOrFingerprint string) (name, owner string, revoked int, err error) {
	if err := u.mayChange("keys:remove"); err != nil {
		return "", "", 0, err
	}
	owner, err = keysOf(u, user, "keys:remove")
	if err != nil {
		return "", "", 0, err
	}
	if owner == u.Name && u.KeyFingerprint != "" && (nameOrFingerprint == u.KeyName || nameOrFingerprint == u.KeyFingerprint) {
		// Said before the write: the session's rechecks must not cut it off
		// between the removal and the line that says it.
		removedOwnKey(ctx)
	}
	k, err := RemoveKey(ctx, b.cfg.Client, owner, nameOrFingerprint)
	if err != nil {
		return "", "", 0, err
	}
	if pk, err := PublicKeyOf(k.PublicKey); err == nil && b.cfg.Tokens != nil {
		// A key that does not parse never signed a session in: it made no token.
		n, err := b.cfg.Tokens.RemoveOfKey(ctx, owner, gossh.FingerprintSHA256(pk))
		if err != nil {
			b.audit(u, "keys:remove", "", "for", owner, "keyName", k.Name, "tokens", n)
			return "", "", n, fmt.Errorf("removed key %s of %s, but not all the tokens made with it (they no longer verify: a token works only while its key is there): %w", k.Name, owner, err)
		}
		revoked = n
	}
	b.audit(u, "keys:remove", "", "for", owner, "keyName", k.Name, "tokens", revoked)
	return k.Name, owner, revoked, nil
}

// AddUser creates a user (admins).
func (b *Backend) AddUser(ctx context.Context, u *User, name string, admin, canCreateApps bool) (appv1.UserRole, error) {
	if err := u.mayChange("users:add"); err != nil {
		return "", err
	}
	if err := requireAdmin(u, "users:add"); err != nil {
		return "", err
	}
	role := appv1.RoleMember
	if admin {
		role = appv1.RoleAdmin
	}
	if err := CreateUser(ctx, b.cfg.Client, name, role, canCreateApps); err != nil {
		return "", err
	}
	b.audit(u, "users:add", "", "name", name, "role", role)
	return role, nil
}

// Users lists the users (admins).
func (b *Backend) Users(ctx context.Context, u *User) ([]UserInfo, error) {
	if err := requireAdmin(u, "users:list"); err != nil {
		return nil, err
	}
	return ListUsers(ctx, b.cfg.Reader)
}

// ListUsers lists every user, by name: users:list, and `bex users list` on the
// server.
func ListUsers(ctx context.Context, r client.Reader) ([]UserInfo, error) {
	var users appv1.UserList
	if err := r.List(ctx, &users); err != nil {
		return nil, err
	}
	out := []UserInfo{}
	for i := range users.Items {
		x := UserOf(&users.Items[i], "", "")
		out = append(out, UserInfo{Name: x.Name, Role: string(x.Role()), CanCreateApps: x.CanCreateApps, Keys: len(users.Items[i].Spec.Keys)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveUser deletes a user, their keys, their access to apps and their tokens
// (admins). The tokens go after the User, so that a refused removal (the last
// admin) keeps them; were their deletion to fail, they verify no more anyway:
// each is bound to the removed User's UID.
func (b *Backend) RemoveUser(ctx context.Context, u *User, name string) error {
	if err := u.mayChange("users:remove"); err != nil {
		return err
	}
	if err := requireAdmin(u, "users:remove"); err != nil {
		return err
	}
	if err := DeleteUser(ctx, b.cfg.Client, name, b.cfg.Namespace); err != nil {
		return err
	}
	removed := 0
	if b.cfg.Tokens != nil {
		n, err := b.cfg.Tokens.RemoveOfUser(ctx, name)
		if err != nil {
			b.audit(u, "users:remove", "", "name", name, "tokens", n)
			return fmt.Errorf("removed user %s, but not all their tokens (they no longer verify; tokens are bound to the removed user): %w", name, err)
		}
		removed = n
	}
	b.audit(u, "users:remove", "", "name", name, "tokens", removed)
	return nil
}
