package sshcmd_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

func newKey(t *testing.T) (gossh.PublicKey, string) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pk, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk))) + " test@bex"
}

func parse(t *testing.T, line string) (string, gossh.PublicKey) {
	t.Helper()
	pk, comment, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	return comment, pk
}
