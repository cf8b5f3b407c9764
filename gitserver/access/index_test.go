package access

import (
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// The indexer is what the API server's informer runs on every User it sees; it must
// skip what does not parse and index each key once.
func TestIndexKeyFingerprints(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk)))
	u := &appv1.User{Spec: appv1.UserSpec{Keys: []appv1.SSHKey{
		{Name: "broken", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB"},
		{Name: "one", PublicKey: line + " first"},
		{Name: "again", PublicKey: line + " same key, other comment"},
		{Name: "empty", PublicKey: ""},
	}}}
	got := indexKeyFingerprints(u)
	if want := []string{gossh.FingerprintSHA256(pk)}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := indexKeyFingerprints(&appv1.App{}); got != nil {
		t.Fatalf("an App indexed as %v", got)
	}
}
