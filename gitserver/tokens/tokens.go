package tokens

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Labels and annotations of a token's Secret.
const (
	LabelKind = appv1.LabelSecret
	KindToken = "agent-token"
	LabelUser = "app.bex.co/token-user"
	LabelName = "app.bex.co/token-name"
	// LabelUserUID is the metadata.uid of the User the token was made for: a
	// token verifies only while a User of that name has that UID, so a user
	// removed and made again under the same name does not inherit it.
	LabelUserUID = "app.bex.co/token-user-uid"
	// AnnotationKeyFingerprint is the SHA256 fingerprint of the SSH key whose
	// session made the token (a label value cannot hold its ':' and '/').
	AnnotationKeyFingerprint = "app.bex.co/key-fingerprint"
	AnnotationMade           = "app.bex.co/created"
	// AnnotationExpires is when the token stops working (RFC 3339); none: never.
	AnnotationExpires = "app.bex.co/expires"
	// AnnotationApps, when present, are the only apps the token may use: their
	// names, sorted, joined by commas (Scope.Apps).
	AnnotationApps = "app.bex.co/token-apps"
	// AnnotationReadOnly is "true" on a token that may change nothing
	// (Scope.ReadOnly); absent: it may change what its user may.
	AnnotationReadOnly = "app.bex.co/token-read-only"
	keyHash            = "sha256"
	secretPrefix       = "agent-token-"
	tokenPrefix        = "bex_"
	maxTokensOfUser    = 50
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Errors.
var (
	ErrInvalidName = errors.New("a token name is 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit")
	ErrExists      = errors.New("token exists")
	ErrNotFound    = errors.New("no such token")
	ErrTooMany     = fmt.Errorf("a user has at most %d tokens: revoke one first", maxTokensOfUser)
	// ErrUnbound: the token would be bound to no user (no UID) or to no key.
	ErrUnbound = errors.New("a token is made for a user read from the API (with its UID), in a session signed in with an SSH key")
	// ErrInvalid: no token like this, or its user is gone.
	ErrInvalid = errors.New("invalid token")
	// ErrInvalidScope: a scope names no app, or something that is no app's name.
	ErrInvalidScope = errors.New("invalid token scope")
)

// Scope is what a token is limited to, below what its user may do; the zero
// Scope is no limit (every app its user may use, every verb). It is fixed when
// the token is made: a scope of other apps takes a new token.
type Scope struct {
	// Apps, when not empty, are the only apps the token may use, by name,
	// sorted: it sees no other, and none of its user's powers beyond apps.
	Apps []string `json:"apps,omitempty"`
	// ReadOnly: the token may read, and change nothing.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Limited reports whether s limits its token at all.
func (s Scope) Limited() bool { return len(s.Apps) > 0 || s.ReadOnly }

// AllowsApp reports whether s lets its token use the app named app (every
// app when s names none).
func (s Scope) AllowsApp(app string) bool { return len(s.Apps) == 0 || slices.Contains(s.Apps, app) }

// String is the scope as tokens:list shows it: "all apps", "apps a,b",
// "read-only" or "apps a,b, read-only".
func (s Scope) String() string {
	var parts []string
	if len(s.Apps) > 0 {
		parts = append(parts, "apps "+strings.Join(s.Apps, ","))
	}
	if s.ReadOnly {
		parts = append(parts, "read-only")
	}
	if len(parts) == 0 {
		return "all apps"
	}
	return strings.Join(parts, ", ")
}

// Normal returns s with its apps sorted, once each, or an error wrapping
// ErrInvalidScope when one is not an app's name (appv1.CheckAppName).
func (s Scope) Normal() (Scope, error) {
	out := Scope{ReadOnly: s.ReadOnly}
	for _, a := range s.Apps {
		if err := appv1.CheckAppName(a); err != nil {
			return Scope{}, fmt.Errorf("%w: %w", ErrInvalidScope, err)
		}
		if !slices.Contains(out.Apps, a) {
			out.Apps = append(out.Apps, a)
		}
	}
	slices.Sort(out.Apps)
	return out, nil
}

// annotate writes s into a token Secret's annotations.
func (s Scope) annotate(annotations map[string]string) {
	if len(s.Apps) > 0 {
		annotations[AnnotationApps] = strings.Join(s.Apps, ",")
	}
	if s.ReadOnly {
		annotations[AnnotationReadOnly] = "true"
	}
}

// scopeOf reads the scope of the token of sec. Annotations that do not parse
// (edited by hand: an app list with a name that is none, a read-only that is
// neither true nor false) are an error: a token is not widened by a typo.
func scopeOf(sec *corev1.Secret) (Scope, error) {
	var s Scope
	switch v, ok := sec.Annotations[AnnotationReadOnly]; {
	case !ok, v == "false":
	case v == "true":
		s.ReadOnly = true
	default:
		return Scope{}, fmt.Errorf("%w: %s is %q, not true or false", ErrInvalidScope, AnnotationReadOnly, v)
	}
	if v, ok := sec.Annotations[AnnotationApps]; ok {
		s.Apps = strings.Split(v, ",")
		n, err := s.Normal()
		if err != nil {
			return Scope{}, err
		}
		s = n
	}
	return s, nil
}

// Store keeps tokens as Secrets of one namespace.
type Store struct {
	// Client reads and writes Secrets (uncached: a revocation counts at once).
	Client client.Client
	// Users reads Users, usually from the gitserver's informer cache.
	Users client.Reader
	// Namespace holds the token Secrets: the gitserver's secrets namespace
	// (--secrets-namespace), not necessarily the Apps'.
	Namespace string
	// Now is the clock expiry is read by; nil: time.Now.
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Owner is whom a token is made for: the user, by name and by the UID of their
// User object, and the SSH key of the session that makes it.
type Owner struct {
	User string
	UID  types.UID
	// KeyFingerprint is the key's SHA256 fingerprint ("SHA256:...").
	KeyFingerprint string
}

// Token is one token, without its value.
type Token struct {
	Name    string    `json:"name"`
	User    string    `json:"user"`
	Created time.Time `json:"created"`
	// Expires is when the token stops working; absent: never.
	Expires *time.Time `json:"expires,omitempty"`
	// Fingerprint is the SHA256 fingerprint of the SSH key that made the token;
	// empty for a token made before tokens recorded it.
	Fingerprint string `json:"fingerprint"`
	// Scope is what the token is limited to; zero: what its user may.
	Scope Scope `json:"scope"`
	// Refused, when set, says why the token no longer verifies whatever its
	// expiry: made before tokens were bound to their user, or for an earlier
	// user of the same name.
	Refused string `json:"refused,omitempty"`
}

// The reasons a stored token no longer verifies, its expiry aside.
const (
	refusedUnbound = "made before tokens were bound to their user: tokens:create makes a new one"
	refusedOther   = "made for an earlier user of this name, removed since: tokens:create makes a new one"
	refusedNoKey   = "made before tokens were bound to their key: tokens:create makes a new one"
	refusedKeyGone = "made with a key removed since (keys:remove): tokens:create makes a new one"
	refusedScope   = "stored with a scope that does not parse (annotations " + AnnotationApps + ", " + AnnotationReadOnly + "): tokens:create makes a new one"
)

// refusal is why the token of sec does not verify for u (its User, read now),
// or "": it must have been made for u's UID, with a key u still has. Checked
// at every verification, so that a token of a removed key is refused even if
// keys:remove stopped before it deleted the key's tokens.
func refusal(sec *corev1.Secret, u *appv1.User) string {
	switch stored := sec.Labels[LabelUserUID]; {
	case stored == "":
		return refusedUnbound
	case types.UID(stored) != u.UID:
		return refusedOther
	}
	fp := sec.Annotations[AnnotationKeyFingerprint]
	if fp == "" {
		return refusedNoKey
	}
	if !HasKey(u, fp) {
		return refusedKeyGone
	}
	return ""
}

// HasKey reports whether u holds a key whose SHA256 fingerprint is fp.
func HasKey(u *appv1.User, fp string) bool {
	for _, k := range u.Spec.Keys {
		pk, _, _, _, err := gossh.ParseAuthorizedKey([]byte(k.PublicKey))
		if err == nil && gossh.FingerprintSHA256(pk) == fp {
			return true
		}
	}
	return false
}

// WellFormed reports whether token has the shape of a token: "bex_" and the
// base64url (unpadded, canonical) of 32 bytes. Verify checks it before any read,
// so that garbage costs the API server nothing.
func WellFormed(token string) bool {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(rest) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 32
}

func hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Create makes a token named name for o, limited to scope (zero: no limit),
// working for ttl (0: until revoked), and returns its value, which is not kept.
// The token is bound to o.UID and records o.KeyFingerprint; both are required.
// Whether o may use scope's apps is the caller's to check; their names are
// checked here (ErrInvalidScope).
func (s *Store) Create(ctx context.Context, o Owner, name string, ttl time.Duration, scope Scope) (string, error) {
	if len(name) > 63 || !nameRE.MatchString(name) {
		return "", ErrInvalidName
	}
	if o.UID == "" || o.KeyFingerprint == "" {
		return "", ErrUnbound
	}
	scope, err := scope.Normal()
	if err != nil {
		return "", err
	}
	user := o.User
	existing, err := s.List(ctx, user, o.UID)
	if err != nil {
		return "", err
	}
	for _, t := range existing {
		if t.Name == name {
			return "", ErrExists
		}
	}
	if len(existing) >= maxTokensOfUser {
		return "", ErrTooMany
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	h := hash(token)
	now := s.now().UTC()
	annotations := map[string]string{AnnotationMade: now.Format(time.RFC3339), AnnotationKeyFingerprint: o.KeyFingerprint}
	if ttl > 0 {
		annotations[AnnotationExpires] = now.Add(ttl).Format(time.RFC3339)
	}
	scope.annotate(annotations)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: secretPrefix + h, Namespace: s.Namespace,
			Labels:      map[string]string{LabelKind: KindToken, LabelUser: user, LabelName: name, LabelUserUID: string(o.UID)},
			Annotations: annotations,
		},
		Data: map[string][]byte{keyHash: []byte(h)},
	}
	if err := s.Client.Create(ctx, sec); err != nil {
		return "", fmt.Errorf("storing the token: %w", err)
	}
	return token, nil
}

// List returns the tokens made under user's name, by name; those that do not
// verify for the User whose UID is uid (as Users has it) say why in Refused
// (they are listed so that they can be revoked, and so that a name they hold
// is explained).
func (s *Store) List(ctx context.Context, user string, uid types.UID) ([]Token, error) {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{LabelKind: KindToken, LabelUser: user}); err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	u := &appv1.User{}
	if err := s.Users.Get(ctx, client.ObjectKey{Name: user}, u); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading user %s: %w", user, err)
	}
	u.UID = uid
	out := []Token{}
	for i := range list.Items {
		sec := &list.Items[i]
		t, err := tokenOf(sec)
		t.Refused = refusal(sec, u)
		if err != nil && t.Refused == "" {
			t.Refused = refusedScope
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Revoke deletes user's token named name; calls with it fail from then on.
func (s *Store) Revoke(ctx context.Context, user, name string) error {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{LabelKind: KindToken, LabelUser: user, LabelName: name}); err != nil {
		return fmt.Errorf("listing tokens: %w", err)
	}
	if len(list.Items) == 0 {
		return ErrNotFound
	}
	for i := range list.Items {
		if err := s.Client.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// RemoveOfUser deletes every token made under user's name (users:remove), and
// returns how many there were.
func (s *Store) RemoveOfUser(ctx context.Context, user string) (int, error) {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{LabelKind: KindToken, LabelUser: user}); err != nil {
		return 0, fmt.Errorf("listing the tokens of %s: %w", user, err)
	}
	for i := range list.Items {
		if err := s.Client.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return i, fmt.Errorf("deleting a token of %s: %w", user, err)
		}
	}
	return len(list.Items), nil
}

// RemoveOfKey deletes the tokens made under user's name with the key whose
// SHA256 fingerprint is fp (keys:remove), and returns how many there were.
// Verify refuses them anyway once the key is gone from the User; deleting them
// keeps tokens:list true and the names free.
func (s *Store) RemoveOfKey(ctx context.Context, user, fp string) (int, error) {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{LabelKind: KindToken, LabelUser: user}); err != nil {
		return 0, fmt.Errorf("listing the tokens of %s: %w", user, err)
	}
	n := 0
	for i := range list.Items {
		if list.Items[i].Annotations[AnnotationKeyFingerprint] != fp {
			continue
		}
		if err := s.Client.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			return n, fmt.Errorf("deleting a token of %s: %w", user, err)
		}
		n++
	}
	return n, nil
}

// Verify returns the User a token acts as, read now, and the token (its name
// and its Scope, which limits what the User may do through it); or an error
// wrapping ErrInvalid. A token of the wrong shape is refused before any read. A
// token verifies only while its User has the UID it was made for: a user
// removed and made again under the same name does not inherit it; and only
// while that User still has the key the token was made with: keys:remove ends
// the key's tokens even if deleting them failed. A token made before tokens
// were bound to a UID (or to a key) is refused, its message saying to make a
// new one (there is no telling whose it was); so is one whose scope
// annotations do not parse (a token is not widened by a typo).
func (s *Store) Verify(ctx context.Context, token string) (*appv1.User, Token, error) {
	if !WellFormed(token) {
		return nil, Token{}, fmt.Errorf("%w: not the shape of a bex token (bex_ and 43 characters of base64url)", ErrInvalid)
	}
	h := hash(token)
	sec := &corev1.Secret{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: secretPrefix + h}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, Token{}, ErrInvalid
		}
		return nil, Token{}, err
	}
	// The name matched; the stored hash must too (a Secret made by hand with
	// this name and no hash is not a token).
	if subtle.ConstantTimeCompare(sec.Data[keyHash], []byte(h)) != 1 || sec.Labels[LabelKind] != KindToken {
		return nil, Token{}, ErrInvalid
	}
	t, err := tokenOf(sec)
	name, tokenName := t.User, t.Name
	if err != nil {
		return nil, Token{}, fmt.Errorf("%w: token %s of %s was %s (%v)", ErrInvalid, tokenName, name, refusedScope, err)
	}
	if exp := t.Expires; exp != nil && !s.now().Before(*exp) {
		return nil, Token{}, fmt.Errorf("%w: token %s of %s expired at %s (tokens:create makes a new one)",
			ErrInvalid, tokenName, name, exp.Format(time.RFC3339))
	}
	if sec.Labels[LabelUserUID] == "" {
		return nil, Token{}, fmt.Errorf("%w: token %s of %s was %s", ErrInvalid, tokenName, name, refusedUnbound)
	}
	u := &appv1.User{}
	if err := s.Users.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, Token{}, fmt.Errorf("%w: token %s of %s: there is no user %s", ErrInvalid, tokenName, name, name)
		}
		return nil, Token{}, err
	}
	if why := refusal(sec, u); why != "" {
		return nil, Token{}, fmt.Errorf("%w: token %s of %s was %s", ErrInvalid, tokenName, name, why)
	}
	return u, t, nil
}

// tokenOf is the token of sec, without its Refused; the error is its scope's,
// when its annotations do not parse (the Token then says no scope).
func tokenOf(sec *corev1.Secret) (Token, error) {
	made, _ := time.Parse(time.RFC3339, sec.Annotations[AnnotationMade])
	scope, err := scopeOf(sec)
	return Token{Name: sec.Labels[LabelName], User: sec.Labels[LabelUser], Created: made, Expires: expiry(sec),
		Fingerprint: sec.Annotations[AnnotationKeyFingerprint], Scope: scope}, err
}

// expiry is when the token of sec stops working, or nil: never. An annotation
// that does not parse counts as expired long ago: a token is not kept alive by
// a typo.
func expiry(sec *corev1.Secret) *time.Time {
	v, ok := sec.Annotations[AnnotationExpires]
	if !ok {
		return nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		t = time.Unix(0, 0).UTC()
	}
	return &t
}

// ParseTTL reads how long a token works: a number of days (90d), a Go duration
// (12h, 30m), or "never" (and "0"). At least a minute, at most ten years.
func ParseTTL(v string) (time.Duration, error) {
	if v == "never" || v == "0" {
		return 0, nil
	}
	bad := fmt.Errorf("%q: want a duration such as 90d, 12h or 30m, or never", v)
	var d time.Duration
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, bad
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			return 0, bad
		}
	}
	if d < time.Minute || d > 3650*24*time.Hour {
		return 0, fmt.Errorf("%q: a token works for at least a minute and at most 3650d", v)
	}
	return d, nil
}
