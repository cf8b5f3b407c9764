package backend_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/tokens"
)

func authorizedKey(t *testing.T) string {
	t.Helper()
	k, _ := keyAndFingerprint(t)
	return k
}

// keyAndFingerprint is a new key's authorized-key line and SHA256 fingerprint.
func keyAndFingerprint(t *testing.T) (string, string) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk))), gossh.FingerprintSHA256(pk)
}

// TestTokensOfARemovedUser: users:remove deletes the user's tokens; a user made
// again under the name gets none of them back and their own work (the
// control); a token cannot make tokens.
func TestTokensOfARemovedUser(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	// The fake client gives objects no UID: the test gives them theirs, as the
	// API server would.
	anaKey, anaFP := keyAndFingerprint(t)
	bobKey, bobFP := keyAndFingerprint(t)
	bob2Key, bob2FP := keyAndFingerprint(t)
	anaObj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "ana", UID: "uid-ana"}, Spec: appv1.UserSpec{Role: appv1.RoleAdmin,
		Keys: []appv1.SSHKey{{Name: "laptop", PublicKey: anaKey}}}}
	bobObj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob", UID: "uid-bob-1"}, Spec: appv1.UserSpec{Role: appv1.RoleMember,
		Keys: []appv1.SSHKey{{Name: "desk", PublicKey: bobKey}}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(anaObj, bobObj).Build()
	var log bytes.Buffer
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Namespace, cfg.Releases = c, ns, &fakeReleases{c: c}
	cfg.Tokens = &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}
	cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ana := backend.UserOf(anaObj, "laptop", anaFP)
	bob := backend.UserOf(bobObj, "desk", bobFP)

	made, err := b.CreateToken(ctx, bob, "ci", "never", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	asToken, _, err := b.VerifyToken(ctx, made.Token)
	if err != nil || asToken.UID != "uid-bob-1" {
		t.Fatalf("bob's token: %+v %v", asToken, err)
	}
	list, _ := b.Tokens(ctx, bob)
	if len(list) != 1 || list[0].Fingerprint != bobFP {
		t.Fatalf("tokens:list: %+v", list)
	}
	// A session signed in with a token has no key: it makes no tokens.
	_, err = b.CreateToken(ctx, asToken, "longer", "never", backend.TokenScope{})
	wantKind(t, "a token making a token", err, backend.Forbidden, "a token cannot make tokens")

	if err := b.RemoveUser(ctx, ana, "bob"); err != nil {
		t.Fatal(err)
	}
	var secs corev1.SecretList
	if err := c.List(ctx, &secs, client.MatchingLabels{tokens.LabelKind: tokens.KindToken}); err != nil || len(secs.Items) != 0 {
		t.Fatalf("bob's tokens outlive users:remove: %d %v", len(secs.Items), err)
	}
	if !strings.Contains(log.String(), "command=users:remove") || !strings.Contains(log.String(), "tokens=1") {
		t.Fatalf("audit of users:remove:\n%s", log.String())
	}
	bob2Obj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob", UID: "uid-bob-2"}, Spec: appv1.UserSpec{Role: appv1.RoleMember,
		Keys: []appv1.SSHKey{{Name: "desk", PublicKey: bob2Key}}}}
	if err := c.Create(ctx, bob2Obj); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.VerifyToken(ctx, made.Token); !errors.Is(err, backend.ErrInvalidToken) {
		t.Fatalf("the removed bob's token for the new bob: %v", err)
	}
	bob2 := backend.UserOf(bob2Obj, "desk", bob2FP)
	if list, _ := b.Tokens(ctx, bob2); len(list) != 0 {
		t.Fatalf("the new bob lists %+v", list)
	}
	fresh, err := b.CreateToken(ctx, bob2, "ci", "never", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	if u, _, err := b.VerifyToken(ctx, fresh.Token); err != nil || u.UID != "uid-bob-2" {
		t.Fatalf("the new bob's token: %+v %v", u, err)
	}
	// The last admin is not removed, and keeps their tokens.
	anaTok, err := b.CreateToken(ctx, ana, "ops", "never", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, "the last admin", b.RemoveUser(ctx, ana, "ana"), backend.Conflict, "last admin")
	if _, _, err := b.VerifyToken(ctx, anaTok.Token); err != nil {
		t.Fatalf("a refused users:remove took the tokens: %v", err)
	}
}

// TestKeysRemoveEndsItsTokens: keys:remove deletes the tokens made with the
// key, and says how many; the token of the key that stays works on (the
// control). A session that removes its own key is marked so in its Uses; one
// that removes another key is not.
func TestKeysRemoveEndsItsTokens(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	deskKey, deskFP := keyAndFingerprint(t)
	ciKey, ciFP := keyAndFingerprint(t)
	bobObj := &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob", UID: "uid-bob"}, Spec: appv1.UserSpec{Role: appv1.RoleMember,
		Keys: []appv1.SSHKey{{Name: "desk", PublicKey: deskKey}, {Name: "ci", PublicKey: ciKey}}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(bobObj).Build()
	var log bytes.Buffer
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Namespace, cfg.Releases = c, ns, &fakeReleases{c: c}
	cfg.Tokens = &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}
	cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fromDesk, err := b.CreateToken(ctx, backend.UserOf(bobObj, "desk", deskFP), "desk-agent", "never", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	fromCI, err := b.CreateToken(ctx, backend.UserOf(bobObj, "ci", ciFP), "ci-agent", "never", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	// The session of ci removes desk: its own key stays, and its rechecks
	// may end it as any other (Uses.OwnKeyRemoved false).
	uses := &backend.Uses{}
	name, owner, revoked, err := b.RemoveKey(backend.WithUses(ctx, uses), backend.UserOf(bobObj, "ci", ciFP), "", "desk")
	if err != nil || name != "desk" || owner != "bob" || revoked != 1 || uses.OwnKeyRemoved() {
		t.Fatalf("keys:remove desk: %q %q %d %v, own key removed %v", name, owner, revoked, err, uses.OwnKeyRemoved())
	}
	if _, _, err := b.VerifyToken(ctx, fromDesk.Token); !errors.Is(err, backend.ErrInvalidToken) {
		t.Fatalf("the token of the removed key: %v", err)
	}
	if u, _, err := b.VerifyToken(ctx, fromCI.Token); err != nil || u.Name != "bob" {
		t.Fatalf("the token of the key that stays: %+v %v", u, err)
	}
	if !strings.Contains(log.String(), "command=keys:remove") || !strings.Contains(log.String(), "tokens=1") {
		t.Fatalf("audit of keys:remove:\n%s", log.String())
	}
	// The session of ci removes ci itself: marked, so that the rechecks let
	// it say so before it ends (the gitserver's recheckOnce).
	uses = &backend.Uses{}
	if _, _, _, err := b.RemoveKey(backend.WithUses(ctx, uses), backend.UserOf(bobObj, "ci", ciFP), "", "ci"); err != nil || !uses.OwnKeyRemoved() {
		t.Fatalf("keys:remove of the session's own key: %v, own key removed %v", err, uses.OwnKeyRemoved())
	}
}
