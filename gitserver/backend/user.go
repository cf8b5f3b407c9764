package backend

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// User is who a request acts as: the owner of the SSH key a session
// authenticated with, or of the bearer token an agent called with. It is read
// again from the User object for every session and every call, so a change of
// role takes effect on the next one.
type User struct {
	Name string
	// UID is the User object's metadata.uid: tokens are bound to it, so that a
	// user removed and made again under the same name is another user.
	UID           types.UID
	Admin         bool
	CanCreateApps bool
	// KeyName names the key that matched ("token:NAME" for a token), for logs.
	KeyName string
	// KeyFingerprint is the SHA256 fingerprint of the session's key
	// ("SHA256:..."), empty for a token.
	KeyFingerprint string
}

// UserOf is the User that u is, signed in with the key (or token) keyName.
func UserOf(u *appv1.User, keyName, fingerprint string) *User {
	admin := u.Spec.Role == appv1.RoleAdmin
	return &User{Name: u.Name, UID: u.UID, Admin: admin, CanCreateApps: admin || u.Spec.CanCreateApps,
		KeyName: keyName, KeyFingerprint: fingerprint}
}

// MayUse reports whether u may push to, read and change an app whose members
// are members: admins always, members when listed, by exact name.
func (u *User) MayUse(members []string) bool {
	return u.Admin || slices.Contains(members, u.Name)
}

// Role is u's role as the API names it.
func (u *User) Role() appv1.UserRole {
	if u.Admin {
		return appv1.RoleAdmin
	}
	return appv1.RoleMember
}
