package backend

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	gossh "golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// The writes of Users and their keys, shared by the backend's operations (the
// keys and users commands) and by `bex users add` run on the server. They read from and write
// to the API server directly: Users are few, and a decision such as "is this the last
// admin key?" must not rest on a cache that may lag.

// ParseKey parses one OpenSSH public key (the contents of a .pub file, or one
// authorized_keys line; options are dropped). It returns the key and its line as
// stored: type, base64 and comment.
func ParseKey(text []byte) (gossh.PublicKey, string, error) {
	pk, comment, _, rest, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		return nil, "", Errorf(Invalid, "not an OpenSSH public key: send the contents of a .pub file on stdin (ssh-ed25519 AAAA... comment)")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, "", Errorf(Invalid, "more than one key: send one public key per command")
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk)))
	if comment = strings.TrimSpace(strings.ReplaceAll(comment, "\n", " ")); comment != "" {
		line += " " + comment
	}
	return pk, line, nil
}

// CreateUser creates the User name with role and canCreateApps and no keys.
func CreateUser(ctx context.Context, c client.Client, name string, role appv1.UserRole, canCreateApps bool) error {
	if !appv1.ValidUserName(name) {
		return Errorf(Invalid, "%q is not a valid user name: use 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit", name)
	}
	u := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appv1.UserSpec{Role: role, CanCreateApps: canCreateApps}}
	if err := c.Create(ctx, u); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return Errorf(Conflict, "user %s exists already: pick another name", name)
		}
		return fmt.Errorf("creating user %s: %w", name, err)
	}
	return nil
}

// AddKey gives user the public key authorizedKey under keyName and returns its
// SHA256 fingerprint. A key that any user holds already is refused: a key names
// exactly one user.
func AddKey(ctx context.Context, c client.Client, user, keyName string, authorizedKey []byte) (string, error) {
	if !appv1.ValidKeyName(keyName) {
		return "", Errorf(Invalid, "%q is not a valid key name: use letters, digits and - _ . @, starting with a letter or digit, at most 63", keyName)
	}
	pk, line, err := ParseKey(authorizedKey)
	if err != nil {
		return "", err
	}
	fp := gossh.FingerprintSHA256(pk)
	var users appv1.UserList
	if err := c.List(ctx, &users); err != nil {
		return "", fmt.Errorf("listing users: %w", err)
	}
	for _, u := range users.Items {
		for _, k := range u.Spec.Keys {
			if held, err := PublicKeyOf(k.PublicKey); err == nil && bytes.Equal(held.Marshal(), pk.Marshal()) {
				if u.Name == user {
					return "", Errorf(Conflict, "%s is already your key %q", fp, k.Name)
				}
				return "", Errorf(Conflict, "%s belongs to another user already: a key names one user", fp)
			}
		}
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := &appv1.User{}
		if err := c.Get(ctx, client.ObjectKey{Name: user}, u); err != nil {
			if apierrors.IsNotFound(err) {
				return Errorf(NotFound, "there is no user %s", user)
			}
			return err
		}
		if slices.ContainsFunc(u.Spec.Keys, func(k appv1.SSHKey) bool { return k.Name == keyName }) {
			return Errorf(Conflict, "%s has a key named %q already: pick another name, or keys:remove it first", user, keyName)
		}
		u.Spec.Keys = append(u.Spec.Keys, appv1.SSHKey{Name: keyName, PublicKey: line})
		return c.Update(ctx, u)
	})
	if err != nil {
		return "", err
	}
	return fp, nil
}

// adminChanges serializes the changes that can take admin keys away (RemoveKey,
// DeleteUser): each reads every User, checks that an admin key is left, then
// writes one User, so two at once could each leave one key and together none.
// One gitserver makes these changes (through the API, not a cache, so each sees
// the one before it).
var adminChanges sync.Mutex

// RemoveKey removes user's key named nameOrFingerprint, or whose SHA256 fingerprint
// it is, and returns it. Removing the last key that an admin holds is refused: the
// server would have nobody left to manage it over SSH.
func RemoveKey(ctx context.Context, c client.Client, user, nameOrFingerprint string) (appv1.SSHKey, error) {
	adminChanges.Lock()
	defer adminChanges.Unlock()
	var removed appv1.SSHKey
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var users appv1.UserList
		if err := c.List(ctx, &users); err != nil {
			return fmt.Errorf("listing users: %w", err)
		}
		i := slices.IndexFunc(users.Items, func(u appv1.User) bool { return u.Name == user })
		if i < 0 {
			return Errorf(NotFound, "there is no user %s", user)
		}
		u := &users.Items[i]
		j := slices.IndexFunc(u.Spec.Keys, func(k appv1.SSHKey) bool {
			if k.Name == nameOrFingerprint {
				return true
			}
			pk, err := PublicKeyOf(k.PublicKey)
			return err == nil && gossh.FingerprintSHA256(pk) == nameOrFingerprint
		})
		if j < 0 {
			return Errorf(NotFound, "%s has no key named or with the fingerprint %q (keys:list shows them)", user, nameOrFingerprint)
		}
		removed = u.Spec.Keys[j]
		before := adminKeys(users.Items)
		u.Spec.Keys = slices.Delete(slices.Clone(u.Spec.Keys), j, j+1)
		if before > 0 && adminKeys(users.Items) == 0 {
			return Errorf(Conflict, "%q is the last admin key: add another admin key first (keys:add)", removed.Name)
		}
		return c.Update(ctx, u)
	})
	return removed, err
}

// DeleteUser deletes the User name and takes it out of the members of every App in
// namespace, so that a later user of the same name does not inherit its apps (nor
// its databases).
// Deleting the last admin is refused.
func DeleteUser(ctx context.Context, c client.Client, name, namespace string) error {
	adminChanges.Lock()
	defer adminChanges.Unlock()
	var users appv1.UserList
	if err := c.List(ctx, &users); err != nil {
		return fmt.Errorf("listing users: %w", err)
	}
	i := slices.IndexFunc(users.Items, func(u appv1.User) bool { return u.Name == name })
	if i < 0 {
		return Errorf(NotFound, "there is no user %s", name)
	}
	rest := slices.Delete(slices.Clone(users.Items), i, i+1)
	if users.Items[i].Spec.Role == appv1.RoleAdmin && adminKeys(rest) == 0 {
		return Errorf(Conflict, "%s is the last admin with a key: make another admin first (users:add NAME --admin)", name)
	}
	var apps appv1.AppList
	if err := c.List(ctx, &apps, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing apps: %w", err)
	}
	for _, a := range apps.Items {
		if !slices.Contains(a.Spec.Members, name) {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			app := &appv1.App{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(&a), app); err != nil {
				return client.IgnoreNotFound(err)
			}
			app.Spec.Members = slices.DeleteFunc(app.Spec.Members, func(m string) bool { return m == name })
			return c.Update(ctx, app)
		})
		if err != nil {
			return fmt.Errorf("removing %s from the members of %s: %w", name, a.Name, err)
		}
	}
	var dbs appv1.DatabaseList
	if err := c.List(ctx, &dbs, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing databases: %w", err)
	}
	for _, d := range dbs.Items {
		if !slices.Contains(d.Spec.Members, name) {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			db := &appv1.Database{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(&d), db); err != nil {
				return client.IgnoreNotFound(err)
			}
			db.Spec.Members = slices.DeleteFunc(db.Spec.Members, func(m string) bool { return m == name })
			return c.Update(ctx, db)
		})
		if err != nil {
			return fmt.Errorf("removing %s from the members of database %s: %w", name, d.Name, err)
		}
	}
	if err := c.Delete(ctx, &users.Items[i]); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting user %s: %w", name, err)
	}
	return nil
}

// adminKeys counts the usable keys held by admins.
func adminKeys(users []appv1.User) int {
	n := 0
	for _, u := range users {
		if u.Spec.Role != appv1.RoleAdmin {
			continue
		}
		for _, k := range u.Spec.Keys {
			if _, err := PublicKeyOf(k.PublicKey); err == nil {
				n++
			}
		}
	}
	return n
}

// PublicKeyOf reads a key as a User's spec holds it (authorized_keys' format), for
// every reader of Users' keys: the backend and the push's key lookup.
func PublicKeyOf(authorized string) (gossh.PublicKey, error) {
	pk, _, _, _, err := gossh.ParseAuthorizedKey([]byte(authorized))
	return pk, err
}
