package sshcmd_test

import (
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"bex.co/bex/internal/testenv"
)

func newKey(t *testing.T) (gossh.PublicKey, string) {
	t.Helper()
	k := testenv.NewSSHKey(t)
	return k.Signer.PublicKey(), k.AuthorizedKey
}

func parse(t *testing.T, line string) (string, gossh.PublicKey) {
	t.Helper()
	pk, comment, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	return comment, pk
}
