package backend

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/tokens"
)

// TokenScope is what a token is limited to, below what its user may do: some
// apps (Apps), or reading only (ReadOnly), or both. The zero TokenScope is no
// limit, and a session signed in with a key has it.
type TokenScope = tokens.Scope

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
	// Scope is the token's limit (VerifyToken sets it; zero: none). A token
	// limited to some apps may use only those (MayUseApp); a read-only token
	// changes nothing (mayChange); either has none of its user's powers beyond
	// the apps and databases it may use (users, keys, tokens, registries, the
	// disk, creating apps and databases, webhook settings: unlimited).
	Scope TokenScope
	// Client is the agent's client as it named itself (the MCP client's name
	// and version), and Reason the reason the agent gave for the change it
	// calls for: both for the audit trail only, set per call.
	Client string
	Reason string
}

// UserOf is the User that u is, signed in with the key (or token) keyName.
func UserOf(u *appv1.User, keyName, fingerprint string) *User {
	admin := u.Spec.Role == appv1.RoleAdmin
	return &User{Name: u.Name, UID: u.UID, Admin: admin, CanCreateApps: admin || u.Spec.CanCreateApps,
		KeyName: keyName, KeyFingerprint: fingerprint}
}

// member is the rule of membership: admins always, members when listed, by
// exact name.
func (u *User) member(members []string) bool {
	return u.Admin || slices.Contains(members, u.Name)
}

// MayUse reports whether u may push to, read and change an app whose members
// are members: admins always, members when listed, by exact name. It names no
// app, so for a token limited to some apps it is false: MayUseApp is the rule
// that knows the app.
func (u *User) MayUse(members []string) bool {
	return len(u.Scope.Apps) == 0 && u.member(members)
}

// MayUseApp reports whether u may push to, read and change the app named app,
// whose members are members: MayUse's rule, within the apps of u's token when
// it is limited to some (a token may use no app its user may not).
func (u *User) MayUseApp(app string, members []string) bool {
	return u.Scope.AllowsApp(app) && u.member(members)
}

// inScope refuses an app outside the apps of u's token (Forbidden), before
// anything is read of it: whether it exists is not the token's to learn.
func (u *User) inScope(app string) error {
	if u.Scope.AllowsApp(app) {
		return nil
	}
	return Errorf(Forbidden, "this token is limited to the apps %s: %s is not one of them (a token's apps are set by tokens:create --apps)", strings.Join(u.Scope.Apps, ", "), app)
}

// mayChange refuses a read-only token what changes something: every
// operation that writes calls it first, whatever else it checks, so that a
// front-end that shows a read-only token no way to change (the MCP server's
// tools/list) is not the only guard. what names the operation, as its ssh
// command does.
func (u *User) mayChange(what string) error {
	if u.Scope.ReadOnly {
		return Errorf(Forbidden, "this token is read-only: %s changes something, and takes a token made without --read-only", what)
	}
	return nil
}

// unlimited refuses a limited token (some apps, or read-only) what reaches
// beyond the apps and databases it may use: its user's keys, tokens and
// account, other users, registries, the disk, creating apps and databases,
// webhook settings. An admin's token limited so is no admin's for those.
func (u *User) unlimited(what string) error {
	if !u.Scope.Limited() {
		return nil
	}
	var limit string
	switch {
	case len(u.Scope.Apps) > 0 && u.Scope.ReadOnly:
		limit = fmt.Sprintf("read-only and limited to the apps %s", strings.Join(u.Scope.Apps, ", "))
	case u.Scope.ReadOnly:
		limit = "read-only"
	default:
		limit = fmt.Sprintf("limited to the apps %s", strings.Join(u.Scope.Apps, ", "))
	}
	return Errorf(Forbidden, "this token is %s: %s is for ssh or a token made without --apps and --read-only", limit, what)
}

// wideAdmin reports whether u has an admin's powers beyond apps (wildcard
// domains, the platform's names): an admin not through a limited token.
func (u *User) wideAdmin() bool {
	return u.Admin && !u.Scope.Limited()
}

// mayCreate reports whether u may create apps and databases: its User
// allows it, and not through a limited token.
func (u *User) mayCreate() bool {
	return u.CanCreateApps && !u.Scope.Limited()
}

// Role is u's role as the API names it.
func (u *User) Role() appv1.UserRole {
	if u.Admin {
		return appv1.RoleAdmin
	}
	return appv1.RoleMember
}
