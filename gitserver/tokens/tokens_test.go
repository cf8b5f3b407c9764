package tokens_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/testenv"
)

// Keys of the users, each an authorized key and its fingerprint.
var (
	bobKey, bobFP   = testKey(1)
	anaKey, anaFP   = testKey(2)
	bob2Key, bob2FP = testKey(3)
)

// bobOwner is bob, signed in with his key.
var bobOwner = tokens.Owner{User: "bob", UID: "uid-bob", KeyFingerprint: bobFP}

// testKey is an ed25519 key made from seed: its authorized-key line and its
// SHA256 fingerprint.
func testKey(seed byte) (string, string) {
	pk, err := gossh.NewPublicKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize)).Public())
	if err != nil {
		panic(err)
	}
	return string(gossh.MarshalAuthorizedKey(pk)), gossh.FingerprintSHA256(pk)
}

// userWith is the User name of UID uid holding the keys.
func userWith(name, uid string, role appv1.UserRole, keys ...string) *appv1.User {
	u := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}, Spec: appv1.UserSpec{Role: role}}
	for i, k := range keys {
		u.Spec.Keys = append(u.Spec.Keys, appv1.SSHKey{Name: fmt.Sprintf("k%d", i), PublicKey: k})
	}
	return u
}

func TestTokens(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		userWith("ana", "uid-ana", appv1.RoleAdmin, anaKey),
		userWith("bob", "uid-bob", appv1.RoleMember, bobKey),
	).Build()
	st := &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}
	ctx := context.Background()

	tok, err := st.Create(ctx, bobOwner, "ci", 0, tokens.Scope{})
	if err != nil || !strings.HasPrefix(tok, "bex_") || len(tok) != 47 {
		t.Fatalf("Create: %q %v", tok, err)
	}
	if _, err := st.Create(ctx, bobOwner, "ci", 0, tokens.Scope{}); !errors.Is(err, tokens.ErrExists) {
		t.Fatalf("the same name twice: %v", err)
	}
	if _, err := st.Create(ctx, bobOwner, "Bad Name", 0, tokens.Scope{}); !errors.Is(err, tokens.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	adminTok, _ := st.Create(ctx, tokens.Owner{User: "ana", UID: "uid-ana", KeyFingerprint: anaFP}, "ci", 0, tokens.Scope{}) // names are per user
	u, made, err := st.Verify(ctx, tok)
	if err != nil || u.Name != "bob" || u.Spec.Role == appv1.RoleAdmin || made.Name != "ci" || made.User != "bob" || made.Scope.Limited() {
		t.Fatalf("Verify: %+v %+v %v", u, made, err)
	}
	if u, _, err := st.Verify(ctx, adminTok); err != nil || u.Spec.Role != appv1.RoleAdmin {
		t.Fatalf("admin's token: %+v %v", u, err)
	}
	// Stored hashed: the token is nowhere in the Secrets.
	var secs corev1.SecretList
	c.List(ctx, &secs)
	for _, sec := range secs.Items {
		if sec.Namespace != "bex-system" {
			t.Fatalf("a token Secret in %s, not the store's namespace", sec.Namespace)
		}
		for _, v := range sec.Data {
			if strings.Contains(string(v), tok[4:]) {
				t.Fatal("the token is stored")
			}
		}
	}
	// One character changed: a different one whatever the token ends with.
	flipped := tok[:len(tok)-1] + "A"
	if tok[len(tok)-1] == 'A' {
		flipped = tok[:len(tok)-1] + "B"
	}
	for _, bad := range []string{"", "bex_", flipped, "Bearer " + tok, strings.ToUpper(tok)} {
		if _, _, err := st.Verify(ctx, bad); !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("Verify(%q): %v", bad, err)
		}
	}
	list, _ := st.List(ctx, "bob", "uid-bob")
	if len(list) != 1 || list[0].Name != "ci" || list[0].Created.IsZero() || list[0].Fingerprint != bobOwner.KeyFingerprint || list[0].Refused != "" {
		t.Fatalf("List: %+v", list)
	}
	if err := st.Revoke(ctx, "bob", "ci"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Verify(ctx, tok); !errors.Is(err, tokens.ErrInvalid) {
		t.Fatalf("a revoked token: %v", err)
	}
	if err := st.Revoke(ctx, "bob", "ci"); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("revoking twice: %v", err)
	}
	// The user gone: the token stops working.
	c.Delete(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "ana"}})
	if _, _, err := st.Verify(ctx, adminTok); !errors.Is(err, tokens.ErrInvalid) {
		t.Fatalf("token of a removed user: %v", err)
	}
	_ = client.ObjectKey{}
}

// TestTokenExpiry: a token made to work for a while works until then, is listed
// with its end, and is refused after it, saying so.
func TestTokenExpiry(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		userWith("bob", "uid-bob", appv1.RoleMember, bobKey)).Build()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	st := &tokens.Store{Client: c, Users: c, Namespace: "bex-system", Now: func() time.Time { return now }}
	ctx := context.Background()
	tok, err := st.Create(ctx, bobOwner, "ci", 90*24*time.Hour, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	forever, _ := st.Create(ctx, bobOwner, "forever", 0, tokens.Scope{})
	list, _ := st.List(ctx, "bob", "uid-bob")
	if len(list) != 2 || list[0].Expires == nil || !list[0].Expires.Equal(now.Add(90*24*time.Hour)) || list[1].Expires != nil {
		t.Fatalf("List: %+v", list)
	}
	now = now.Add(90*24*time.Hour - time.Second)
	if _, _, err := st.Verify(ctx, tok); err != nil {
		t.Fatalf("a second before its end: %v", err)
	}
	now = now.Add(time.Second)
	_, _, err = st.Verify(ctx, tok)
	if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "token ci of bob expired at 2027-02-28T12:00:00Z") {
		t.Fatalf("at its end: %v", err)
	}
	now = now.AddDate(20, 0, 0)
	if _, _, err := st.Verify(ctx, forever); err != nil {
		t.Fatalf("a token without an end, 20 years on: %v", err)
	}
}

func TestParseTTL(t *testing.T) {
	for in, want := range map[string]time.Duration{"90d": 90 * 24 * time.Hour, "12h": 12 * time.Hour, "30m": 30 * time.Minute,
		"never": 0, "0": 0, "1h30m": 90 * time.Minute} {
		if got, err := tokens.ParseTTL(in); err != nil || got != want {
			t.Errorf("ParseTTL(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1d", "30s", "3651d", "1.5d", "forever"} {
		if _, err := tokens.ParseTTL(in); err == nil {
			t.Errorf("ParseTTL(%q) accepted", in)
		}
	}
}

func newStore(t *testing.T, objs ...client.Object) (*tokens.Store, client.WithWatch) {
	t.Helper()
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	return &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}, c
}

// TestTokenBoundToUID: a token belongs to the User it was made for, not to the
// name. bob removed and a new bob made (another UID): the old token never
// verifies, says why, and is listed as refused; the new bob's token works.
func TestTokenBoundToUID(t *testing.T) {
	st, c := newStore(t, userWith("bob", "uid-bob", appv1.RoleMember, bobKey))
	ctx := context.Background()
	old, err := st.Create(ctx, bobOwner, "ci", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Verify(ctx, old); err != nil {
		t.Fatalf("before the removal: %v", err)
	}
	var secs corev1.SecretList
	c.List(ctx, &secs)
	sec := secs.Items[0]
	if sec.Labels[tokens.LabelUserUID] != "uid-bob" || sec.Annotations[tokens.AnnotationKeyFingerprint] != bobFP {
		t.Fatalf("the Secret does not bind the token: %v %v", sec.Labels, sec.Annotations)
	}
	if err := c.Delete(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, userWith("bob", "uid-bob-2", appv1.RoleMember, bob2Key)); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.Verify(ctx, old)
	if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "token ci of bob was made for an earlier user of this name") {
		t.Fatalf("the old bob's token for the new bob: %v", err)
	}
	list, _ := st.List(ctx, "bob", "uid-bob-2")
	if len(list) != 1 || !strings.Contains(list[0].Refused, "earlier user") {
		t.Fatalf("List for the new bob: %+v", list)
	}
	// The control: the new bob's own token works.
	fresh, err := st.Create(ctx, tokens.Owner{User: "bob", UID: "uid-bob-2", KeyFingerprint: bob2FP}, "ci2", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if u, _, err := st.Verify(ctx, fresh); err != nil || u.UID != "uid-bob-2" {
		t.Fatalf("the new bob's token: %+v %v", u, err)
	}
	// RemoveOfUser deletes both, whoever they were made for.
	if n, err := st.RemoveOfUser(ctx, "bob"); err != nil || n != 2 {
		t.Fatalf("RemoveOfUser: %d %v", n, err)
	}
	if list, _ := st.List(ctx, "bob", "uid-bob-2"); len(list) != 0 {
		t.Fatalf("left after RemoveOfUser: %+v", list)
	}
	if _, _, err := st.Verify(ctx, fresh); !errors.Is(err, tokens.ErrInvalid) {
		t.Fatalf("a removed token: %v", err)
	}
	// No UID, or no key: no token.
	for _, o := range []tokens.Owner{{User: "bob", KeyFingerprint: "SHA256:x"}, {User: "bob", UID: "uid-bob-2"}} {
		if _, err := st.Create(ctx, o, "x", 0, tokens.Scope{}); !errors.Is(err, tokens.ErrUnbound) {
			t.Fatalf("Create(%+v): %v", o, err)
		}
	}
}

// TestTokenMadeBeforeBinding: a token Secret without a UID (made before tokens
// were bound to their user) is refused with a line saying to make a new one,
// and listed as refused.
func TestTokenMadeBeforeBinding(t *testing.T) {
	st, c := newStore(t, userWith("bob", "uid-bob", appv1.RoleMember, bobKey))
	ctx := context.Background()
	tok, err := st.Create(ctx, bobOwner, "old", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	// Made the way the earlier bex made them: no UID label, no fingerprint.
	var secs corev1.SecretList
	c.List(ctx, &secs)
	sec := secs.Items[0]
	delete(sec.Labels, tokens.LabelUserUID)
	delete(sec.Annotations, tokens.AnnotationKeyFingerprint)
	if err := c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.Verify(ctx, tok)
	if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "made before tokens were bound to their user: tokens:create makes a new one") {
		t.Fatalf("a token made before the binding: %v", err)
	}
	if list, _ := st.List(ctx, "bob", "uid-bob"); len(list) != 1 || list[0].Fingerprint != "" || !strings.Contains(list[0].Refused, "made before") {
		t.Fatalf("List: %+v", list)
	}
}

// TestMalformedTokenNoRead: a bearer value that is not the shape of a token is
// refused before any read of the API server; a well-formed unknown one costs
// exactly one Get (the control that the counter counts).
func TestMalformedTokenNoRead(t *testing.T) {
	_, c := newStore(t, userWith("bob", "uid-bob", appv1.RoleMember, bobKey))
	cc := &testenv.CountingClient{WithWatch: c}
	st := &tokens.Store{Client: cc, Users: cc, Namespace: "bex-system"}
	ctx := context.Background()
	good := "bex_" + strings.Repeat("A", 43)
	for _, bad := range []string{"", "bex_", "bex_" + strings.Repeat("A", 42), "bex_" + strings.Repeat("A", 44),
		"bex_" + strings.Repeat("!", 43), "bex_" + strings.Repeat("A", 42) + "=", "bex_" + strings.Repeat("A", 41) + "+/",
		"BEX_" + strings.Repeat("A", 43), "xyz_" + strings.Repeat("A", 43), strings.Repeat("A", 47),
		// Not canonical: the last character carries bits that 32 bytes do not have.
		"bex_" + strings.Repeat("A", 42) + "B"} {
		if tokens.WellFormed(bad) {
			t.Errorf("WellFormed(%q)", bad)
		}
		if _, _, err := st.Verify(ctx, bad); !errors.Is(err, tokens.ErrInvalid) {
			t.Fatalf("Verify(%q): %v", bad, err)
		}
	}
	if cc.Reads() != 0 {
		t.Fatalf("malformed tokens made %d API calls", cc.Reads())
	}
	if !tokens.WellFormed(good) {
		t.Fatalf("WellFormed(%q) is false", good)
	}
	if _, _, err := st.Verify(ctx, good); !errors.Is(err, tokens.ErrInvalid) || cc.Reads() != 1 {
		t.Fatalf("a well-formed unknown token: %v, %d calls", err, cc.Reads())
	}
	tok, err := st.Create(ctx, bobOwner, "ci", 0, tokens.Scope{})
	if err != nil || !tokens.WellFormed(tok) {
		t.Fatalf("a made token is not well formed: %q %v", tok, err)
	}
}

// TestTokenOfARemovedKey: a token verifies only while its User still has the
// key that made it. bob's laptop key goes from the User without its tokens
// being deleted (keys:remove stopped between its two writes): the laptop's
// token is refused, saying why, and listed as refused; the token of bob's
// other key works on (the control). RemoveOfKey deletes the laptop's token
// only. A token that records no key is refused too.
func TestTokenOfARemovedKey(t *testing.T) {
	st, c := newStore(t, userWith("bob", "uid-bob", appv1.RoleMember, bobKey, bob2Key))
	ctx := context.Background()
	laptop, err := st.Create(ctx, bobOwner, "laptop", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	ciOwner := tokens.Owner{User: "bob", UID: "uid-bob", KeyFingerprint: bob2FP}
	ci, err := st.Create(ctx, ciOwner, "ci", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Verify(ctx, laptop); err != nil {
		t.Fatalf("before the removal: %v", err)
	}
	u := &appv1.User{}
	if err := c.Get(ctx, client.ObjectKey{Name: "bob"}, u); err != nil {
		t.Fatal(err)
	}
	u.Spec.Keys = u.Spec.Keys[1:] // the laptop key goes
	if err := c.Update(ctx, u); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.Verify(ctx, laptop)
	if !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "token laptop of bob was made with a key removed since (keys:remove)") {
		t.Fatalf("the token of a removed key: %v", err)
	}
	if got, _, err := st.Verify(ctx, ci); err != nil || got.Name != "bob" {
		t.Fatalf("the token of the key that stays (the control): %v", err)
	}
	list, _ := st.List(ctx, "bob", "uid-bob")
	if len(list) != 2 || list[0].Name != "ci" || list[0].Refused != "" || !strings.Contains(list[1].Refused, "key removed since") {
		t.Fatalf("List: %+v", list)
	}
	if n, err := st.RemoveOfKey(ctx, "bob", bobFP); err != nil || n != 1 {
		t.Fatalf("RemoveOfKey: %d %v", n, err)
	}
	if list, _ := st.List(ctx, "bob", "uid-bob"); len(list) != 1 || list[0].Name != "ci" {
		t.Fatalf("List after RemoveOfKey: %+v", list)
	}
	if _, _, err := st.Verify(ctx, ci); err != nil {
		t.Fatalf("RemoveOfKey took the other key's token: %v", err)
	}
	// Bound to its user but to no key: refused, saying to make a new one.
	var secs corev1.SecretList
	c.List(ctx, &secs)
	sec := secs.Items[0]
	delete(sec.Annotations, tokens.AnnotationKeyFingerprint)
	if err := c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Verify(ctx, ci); !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "made before tokens were bound to their key") {
		t.Fatalf("a token without its key: %v", err)
	}
}

// TestTokenScopes: a token made with a scope is stored with it (annotations),
// listed with it and verifies with it; the apps are checked as app names,
// kept sorted and once each; a scope whose annotations were edited into
// something that does not parse is refused, not widened, and listed as
// refused. The control: a token made without a scope is unlimited.
func TestTokenScopes(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(userWith("bob", "uid-bob", appv1.RoleMember, bobKey)).Build()
	st := &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}
	ctx := context.Background()

	for _, bad := range [][]string{{""}, {"shop", "Bad"}, {"a,b"}} {
		if _, err := st.Create(ctx, bobOwner, "bad", 0, tokens.Scope{Apps: bad}); !errors.Is(err, tokens.ErrInvalidScope) || !strings.Contains(err.Error(), "is not an app name") {
			t.Fatalf("apps %q: %v", bad, err)
		}
	}
	full, err := st.Create(ctx, bobOwner, "full", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := st.Create(ctx, bobOwner, "scoped", 0, tokens.Scope{Apps: []string{"shop", "cart", "shop"}})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := st.Create(ctx, bobOwner, "ro", 0, tokens.Scope{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	both, err := st.Create(ctx, bobOwner, "both", 0, tokens.Scope{Apps: []string{"shop"}, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token, scope string
		apps         []string
		readOnly     bool
	}{{full, "all apps", nil, false}, {scoped, "apps cart,shop", []string{"cart", "shop"}, false}, {ro, "read-only", nil, true}, {both, "apps shop, read-only", []string{"shop"}, true}} {
		_, got, err := st.Verify(ctx, c.token)
		if err != nil || got.Scope.String() != c.scope || !slices.Equal(got.Scope.Apps, c.apps) || got.Scope.ReadOnly != c.readOnly {
			t.Errorf("Verify of the token of scope %q: %+v %v", c.scope, got.Scope, err)
		}
	}
	list, err := st.List(ctx, "bob", "uid-bob")
	if err != nil || len(list) != 4 {
		t.Fatalf("List: %+v %v", list, err)
	}
	got := map[string]string{}
	for _, tk := range list {
		got[tk.Name] = tk.Scope.String()
	}
	if want := map[string]string{"full": "all apps", "scoped": "apps cart,shop", "ro": "read-only", "both": "apps shop, read-only"}; !maps.Equal(got, want) {
		t.Fatalf("listed scopes %v, want %v", got, want)
	}
	var sec corev1.Secret
	var secs corev1.SecretList
	if err := c.List(ctx, &secs, client.MatchingLabels{tokens.LabelName: "both"}); err != nil || len(secs.Items) != 1 {
		t.Fatalf("the Secret of both: %v", err)
	}
	sec = secs.Items[0]
	if sec.Annotations[tokens.AnnotationApps] != "shop" || sec.Annotations[tokens.AnnotationReadOnly] != "true" {
		t.Fatalf("annotations %v", sec.Annotations)
	}
	// Edited by hand into what does not parse: refused, not widened.
	for _, edit := range []map[string]string{{tokens.AnnotationApps: "shop,Bad"}, {tokens.AnnotationApps: ""}, {tokens.AnnotationReadOnly: "yes"}} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(&secs.Items[0]), &sec); err != nil {
			t.Fatal(err)
		}
		was := maps.Clone(sec.Annotations)
		maps.Copy(sec.Annotations, edit)
		if err := c.Update(ctx, &sec); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Verify(ctx, both); !errors.Is(err, tokens.ErrInvalid) || !strings.Contains(err.Error(), "scope that does not parse") {
			t.Errorf("a scope edited to %v: %v", edit, err)
		}
		list, _ := st.List(ctx, "bob", "uid-bob")
		if i := slices.IndexFunc(list, func(tk tokens.Token) bool { return tk.Name == "both" }); i < 0 || !strings.Contains(list[i].Refused, "scope that does not parse") {
			t.Errorf("List of a scope edited to %v: %+v", edit, list)
		}
		sec.Annotations = was
		if err := c.Update(ctx, &sec); err != nil {
			t.Fatal(err)
		}
	}
	if _, got, err := st.Verify(ctx, both); err != nil || got.Scope.String() != "apps shop, read-only" {
		t.Fatalf("the scope restored: %+v %v", got, err)
	}
}
