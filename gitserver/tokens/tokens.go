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
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Labels and annotations of a token's Secret.
const (
	LabelKind      = appv1.LabelSecret
	KindToken      = "agent-token"
	LabelUser      = "app.bex.co/token-user"
	LabelName      = "app.bex.co/token-name"
	AnnotationMade = "app.bex.co/created"
	// AnnotationExpires is when the token stops working (RFC 3339); none: never.
	AnnotationExpires = "app.bex.co/expires"
	keyHash           = "sha256"
	secretPrefix      = "agent-token-"
	tokenPrefix       = "bex_"
	maxTokensOfUser   = 50
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Errors.
var (
	ErrInvalidName = errors.New("a token name is 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit")
	ErrExists      = errors.New("token exists")
	ErrNotFound    = errors.New("no such token")
	ErrTooMany     = fmt.Errorf("a user has at most %d tokens: revoke one first", maxTokensOfUser)
	// ErrInvalid: no token like this, or its user is gone.
	ErrInvalid = errors.New("invalid token")
)

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

// Token is one token, without its value.
type Token struct {
	Name    string    `json:"name"`
	User    string    `json:"user"`
	Created time.Time `json:"created"`
	// Expires is when the token stops working; absent: never.
	Expires *time.Time `json:"expires,omitempty"`
}

func hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Create makes a token named name for user, working for ttl (0: until revoked),
// and returns its value, which is not kept.
func (s *Store) Create(ctx context.Context, user, name string, ttl time.Duration) (string, error) {
	if len(name) > 63 || !nameRE.MatchString(name) {
		return "", ErrInvalidName
	}
	existing, err := s.List(ctx, user)
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
	annotations := map[string]string{AnnotationMade: now.Format(time.RFC3339)}
	if ttl > 0 {
		annotations[AnnotationExpires] = now.Add(ttl).Format(time.RFC3339)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: secretPrefix + h, Namespace: s.Namespace,
			Labels:      map[string]string{LabelKind: KindToken, LabelUser: user, LabelName: name},
			Annotations: annotations,
		},
		Data: map[string][]byte{keyHash: []byte(h)},
	}
	if err := s.Client.Create(ctx, sec); err != nil {
		return "", fmt.Errorf("storing the token: %w", err)
	}
	return token, nil
}

// List returns user's tokens by name.
func (s *Store) List(ctx context.Context, user string) ([]Token, error) {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace), client.MatchingLabels{LabelKind: KindToken, LabelUser: user}); err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	out := []Token{}
	for _, sec := range list.Items {
		t, _ := time.Parse(time.RFC3339, sec.Annotations[AnnotationMade])
		out = append(out, Token{Name: sec.Labels[LabelName], User: user, Created: t, Expires: expiry(&sec)})
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

// Verify returns the User a token acts as, read now, and the token's name; or an
// error wrapping ErrInvalid.
func (s *Store) Verify(ctx context.Context, token string) (*appv1.User, string, error) {
	if !strings.HasPrefix(token, tokenPrefix) || len(token) != len(tokenPrefix)+43 {
		return nil, "", ErrInvalid
	}
	h := hash(token)
	sec := &corev1.Secret{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: secretPrefix + h}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", ErrInvalid
		}
		return nil, "", err
	}
	// The name matched; the stored hash must too (a Secret made by hand with
	// this name and no hash is not a token).
	if subtle.ConstantTimeCompare(sec.Data[keyHash], []byte(h)) != 1 || sec.Labels[LabelKind] != KindToken {
		return nil, "", ErrInvalid
	}
	if exp := expiry(sec); exp != nil && !s.now().Before(*exp) {
		return nil, "", fmt.Errorf("%w: token %s of %s expired at %s (tokens:create makes a new one)",
			ErrInvalid, sec.Labels[LabelName], sec.Labels[LabelUser], exp.Format(time.RFC3339))
	}
	name := sec.Labels[LabelUser]
	u := &appv1.User{}
	if err := s.Users.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", ErrInvalid
		}
		return nil, "", err
	}
	return u, sec.Labels[LabelName], nil
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
