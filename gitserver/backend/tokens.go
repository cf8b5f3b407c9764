package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"bex.co/bex/gitserver/tokens"
)

// DefaultTokenTTL is how long a token works when its maker says nothing.
const DefaultTokenTTL = "90d"

// ErrInvalidToken is VerifyToken's error for a token that does not verify:
// unknown, expired or of a removed user. Its message says which, for the log.
var ErrInvalidToken = tokens.ErrInvalid

func (b *Backend) tokenStore() (*tokens.Store, error) {
	if b.cfg.Tokens == nil {
		return nil, Errorf(Invalid, "this server has no agents' API")
	}
	return b.cfg.Tokens, nil
}

// mcpURL is the MCP endpoint, or "" when this server serves none.
func (b *Backend) mcpURL() string {
	if b.cfg.HooksURL == "" {
		return ""
	}
	return strings.TrimSuffix(b.cfg.HooksURL, "/") + "/mcp"
}

// CreateToken makes a bearer token named name that acts as u, for ttl (as
// tokens:create --expires-in takes it: 90d, 12h, 30m or never), limited to
// scope (zero: what u may do). The token is in the result, shown once. It is
// bound to u's UID and records the fingerprint of u's SSH key; a session signed
// in with a token (u.KeyFingerprint empty) makes none, so that a token, leaked
// or short-lived, cannot make itself a longer-lived successor. The apps of
// scope are app names u may use now (an app u may not, or that does not exist,
// is refused as app_status would refuse it): a token is not made for apps its
// maker cannot reach.
func (b *Backend) CreateToken(ctx context.Context, u *User, name, ttl string, scope TokenScope) (*TokenCreated, error) {
	if err := u.mayChange("tokens:create"); err != nil {
		return nil, err
	}
	store, err := b.tokenStore()
	if err != nil {
		return nil, err
	}
	if u.KeyFingerprint == "" {
		return nil, Errorf(Forbidden, "tokens are made over ssh, signed in with a key (ssh bex@HOST tokens:create %s): a token cannot make tokens", name)
	}
	if u.UID == "" {
		return nil, fmt.Errorf("creating a token for %s: the user has no UID to bind it to", u.Name)
	}
	d, err := tokens.ParseTTL(ttl)
	if err != nil {
		return nil, Errorf(Invalid, "--expires-in %v", err)
	}
	if scope.Apps != nil && len(scope.Apps) == 0 {
		return nil, Errorf(Invalid, "--apps names no app: give one or more, as --apps shop,cart")
	}
	for _, app := range scope.Apps {
		if _, err := b.app(ctx, u, app); err != nil {
			var e *Error
			if errors.As(err, &e) {
				return nil, &Error{Kind: e.Kind, Msg: "--apps: " + e.Msg, Err: e.Err}
			}
			return nil, err
		}
	}
	if scope, err = scope.Normal(); err != nil {
		return nil, Errorf(Invalid, "--apps: %v", err)
	}
	tok, err := store.Create(ctx, tokens.Owner{User: u.Name, UID: u.UID, KeyFingerprint: u.KeyFingerprint}, name, d, scope)
	switch {
	case errors.Is(err, tokens.ErrExists):
		return nil, Errorf(Conflict, "%s has a token named %s already (tokens:revoke %s, then create it again)", u.Name, name, name)
	case errors.Is(err, tokens.ErrInvalidName), errors.Is(err, tokens.ErrTooMany):
		return nil, Errorf(Invalid, "%v", err)
	case err != nil:
		return nil, err
	}
	b.audit(u, "tokens:create", "", "token", name, "expires_in", ttl, "scope", scope.String())
	out := &TokenCreated{Name: name, User: u.Name, Token: tok, MCP: b.mcpURL(), Scope: scope}
	if d > 0 {
		exp := time.Now().Add(d).UTC().Truncate(time.Second)
		out.Expires = &exp
	}
	return out, nil
}

// Tokens lists u's tokens (names, not values), with the fingerprint of the key
// that made each and its scope; one that no longer verifies says why in its
// Refused.
func (b *Backend) Tokens(ctx context.Context, u *User) ([]tokens.Token, error) {
	if err := u.unlimited("tokens:list"); err != nil {
		return nil, err
	}
	store, err := b.tokenStore()
	if err != nil {
		return nil, err
	}
	return store.List(ctx, u.Name, u.UID)
}

// RevokeToken deletes u's token named name; calls with it fail from then on.
func (b *Backend) RevokeToken(ctx context.Context, u *User, name string) error {
	if err := u.mayChange("tokens:revoke"); err != nil {
		return err
	}
	if err := u.unlimited("tokens:revoke"); err != nil {
		return err
	}
	store, err := b.tokenStore()
	if err != nil {
		return err
	}
	if err := store.Revoke(ctx, u.Name, name); err != nil {
		if errors.Is(err, tokens.ErrNotFound) {
			return Errorf(NotFound, "%s has no token named %q (tokens:list shows them)", u.Name, name)
		}
		return err
	}
	b.audit(u, "tokens:revoke", "", "token", name)
	return nil
}

// VerifyToken returns the User a bearer token acts as, read now, with the
// token's Scope, and the token's name; an error wrapping ErrInvalidToken when
// it does not verify.
func (b *Backend) VerifyToken(ctx context.Context, token string) (*User, string, error) {
	store, err := b.tokenStore()
	if err != nil {
		return nil, "", err
	}
	au, t, err := store.Verify(ctx, token)
	if err != nil {
		return nil, "", fmt.Errorf("verifying a token: %w", err)
	}
	u := UserOf(au, "token:"+t.Name, "")
	u.Scope = t.Scope
	return u, t.Name, nil
}
