package testenv

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

// SSHKey is an ed25519 key pair, its private half written where the ssh client
// reads it.
type SSHKey struct {
	// Path is the private key file (mode 0600).
	Path   string
	Signer gossh.Signer
	// AuthorizedKey is the public key as one authorized_keys line, with a comment.
	AuthorizedKey string
}

// NewSSHKey makes a key pair in a temporary directory of t.
func NewSSHKey(t testing.TB) *SSHKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey()))) + " test@bex"
	return &SSHKey{Path: path, Signer: signer, AuthorizedKey: line}
}

// SSHCommand is the real OpenSSH client logging in as user at addr ("host:port")
// with key alone, in batch mode, trusting any host key, and running args (which ssh
// joins with spaces into one command string, as it does for a user).
func SSHCommand(key *SSHKey, user, addr string, args ...string) *exec.Cmd {
	host, port, _ := net.SplitHostPort(addr)
	return exec.Command("ssh", append([]string{"-F", "/dev/null", "-p", port, "-i", key.Path, "-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR", user + "@" + host}, args...)...)
}
