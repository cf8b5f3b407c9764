package tokens_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/tokens"
)

func TestTokens(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "ana"}, Spec: appv1.UserSpec{Role: appv1.RoleAdmin}},
		&appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob"}, Spec: appv1.UserSpec{Role: appv1.RoleMember}},
	).Build()
	st := &tokens.Store{Client: c, Users: c, Namespace: "bex-system"}
	ctx := context.Background()

	tok, err := st.Create(ctx, "bob", "ci", 0)
	if err != nil || !strings.HasPrefix(tok, "bex_") || len(tok) != 47 {
		t.Fatalf("Create: %q %v", tok, err)
	}
	if _, err := st.Create(ctx, "bob", "ci", 0); !errors.Is(err, tokens.ErrExists) {
		t.Fatalf("the same name twice: %v", err)
	}
	if _, err := st.Create(ctx, "bob", "Bad Name", 0); !errors.Is(err, tokens.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	adminTok, _ := st.Create(ctx, "ana", "ci", 0) // names are per user
	u, name, err := st.Verify(ctx, tok)
	if err != nil || u.Name != "bob" || u.Spec.Role == appv1.RoleAdmin || name != "ci" {
		t.Fatalf("Verify: %+v %q %v", u, name, err)
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
	list, _ := st.List(ctx, "bob")
	if len(list) != 1 || list[0].Name != "ci" || list[0].Created.IsZero() {
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
		&appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob"}, Spec: appv1.UserSpec{Role: appv1.RoleMember}}).Build()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	st := &tokens.Store{Client: c, Users: c, Namespace: "bex-system", Now: func() time.Time { return now }}
	ctx := context.Background()
	tok, err := st.Create(ctx, "bob", "ci", 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forever, _ := st.Create(ctx, "bob", "forever", 0)
	list, _ := st.List(ctx, "bob")
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
