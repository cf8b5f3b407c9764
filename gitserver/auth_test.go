package gitserver_test

import (
	"bytes"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
)

// impostor offers one public key and signs with another key's private half, or
// returns garbage: the signer a malicious client would write.
type impostor struct {
	offered gossh.PublicKey
	real    gossh.Signer // nil: an empty signature
}

func (i impostor) PublicKey() gossh.PublicKey { return i.offered }

func (i impostor) Sign(r io.Reader, data []byte) (*gossh.Signature, error) {
	if i.real == nil {
		return &gossh.Signature{Format: i.offered.Type(), Blob: make([]byte, 64)}, nil
	}
	return i.real.Sign(r, data)
}

// sshRun runs command over x/crypto/ssh with the given signers, in order, and
// returns what the session printed.
func sshRun(addr, command string, signers ...gossh.Signer) (string, error) {
	cfg := &gossh.ClientConfig{
		User:            "git",
		Auth:            []gossh.AuthMethod{gossh.PublicKeys(signers...)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(),
		Timeout:         10 * time.Second,
	}
	client, err := gossh.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	var out bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &out
	sess.Stdin = strings.NewReader("0000")
	err = sess.Run(command)
	return out.String(), err
}

func TestOfferingAnotherUsersKeyDoesNotGrantTheirAccess(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	member := e.addUser("member", appv1.RoleMember, false)
	e.createApp("private")
	e.createApp("shared", member)

	// The admin's public key with a signature made by the member's key: refused.
	if out, err := sshRun(e.addr, "git-receive-pack 'private'", impostor{offered: admin.signer.PublicKey(), real: member.signer}); err == nil {
		t.Fatalf("signing the admin's key with another key was accepted:\n%s", out)
	}
	// The admin's public key with an empty signature: refused.
	if out, err := sshRun(e.addr, "git-receive-pack 'private'", impostor{offered: admin.signer.PublicKey()}); err == nil {
		t.Fatalf("an empty signature was accepted:\n%s", out)
	}
	// The bypass itself, with the real ssh client: it offers the admin's public key
	// (its private half is locked by a passphrase that ssh, in batch mode, cannot
	// ask for), the server accepts it as a candidate, ssh cannot sign with it and
	// moves on to the member's own key. The session must be the member's, not the
	// admin's (soft-serve's bypass).
	pubOnly := filepath.Join(t.TempDir(), "admin")
	raw, err := os.ReadFile(admin.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	adminKey, err := gossh.ParseRawPrivateKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	locked, err := gossh.MarshalPrivateKeyWithPassphrase(adminKey, "", []byte("not known to the client"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubOnly, pem.EncodeToMemory(locked), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubOnly+".pub", gossh.MarshalAuthorizedKey(admin.signer.PublicKey()), 0o644); err != nil {
		t.Fatal(err)
	}
	impersonate := func(app string) (string, error) {
		host, port, _ := net.SplitHostPort(e.addr)
		cmd := exec.Command("ssh", "-F", "/dev/null", "-p", port, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
			"-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no", "-v",
			"-i", pubOnly, "-i", member.keyPath, "git@"+host, "git-receive-pack '"+app+"'")
		cmd.Stdin = strings.NewReader("0000")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := impersonate("private")
	if !strings.Contains(out, "Server accepts key: "+pubOnly) {
		t.Fatalf("the test did not make ssh offer the admin's key first:\n%s", out)
	}
	if err == nil || !strings.Contains(out, "user "+member.name+" has no access to app private") {
		t.Fatalf("after offering the admin's key, the member got: %v\n%s", err, out)
	}
	// And the member's own access still works that way round.
	out, err = impersonate("shared")
	if err != nil || !strings.Contains(out, "capabilities^{}") {
		t.Fatalf("member's own app: %v\n%s", err, out)
	}
}

func TestOnlyPublicKeysAuthenticate(t *testing.T) {
	e := newEnv(t)
	e.addUser("admin", appv1.RoleAdmin, false)
	for name, auth := range map[string]gossh.AuthMethod{
		"password":             gossh.Password("hunter2"),
		"keyboard-interactive": gossh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) { return nil, nil }),
	} {
		_, err := gossh.Dial("tcp", e.addr, &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{auth}, HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
		if err == nil {
			t.Errorf("%s authentication was accepted", name)
		}
	}
}

func TestPortForwardingIsRefused(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	client, err := gossh.Dial("tcp", e.addr, &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(admin.signer)}, HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if conn, err := client.Dial("tcp", e.addr); err == nil {
		conn.Close()
		t.Fatal("local port forwarding was allowed")
	}
	if l, err := client.Listen("tcp", "127.0.0.1:0"); err == nil {
		l.Close()
		t.Fatal("remote port forwarding was allowed")
	}
}

func TestSilentConnectionsAreClosedAfterTheHandshakeTimeout(t *testing.T) {
	e := newEnv(t, func(c *config) { c.HandshakeTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	// Read the server's version line, then say nothing: the server must hang up.
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("the server did not close a silent connection: %v", err)
	}
}

func TestHostKeyIsKeptAcrossRestarts(t *testing.T) {
	state := t.TempDir()
	cfg := gitserver.DefaultConfig()
	cfg.StateDir = state
	pl := nopPipeline(t, state)
	a, err := gitserver.New(cfg, nopDirectory{}, nopAdmission{}, pl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := gitserver.New(cfg, nopDirectory{}, nopAdmission{}, pl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.HostKey().Marshal(), b.HostKey().Marshal()) || a.HostKey().Type() != gossh.KeyAlgoED25519 {
		t.Fatalf("host key changed across restarts or is not ed25519: %s", a.HostKey().Type())
	}
	if fi, err := os.Stat(filepath.Join(state, "ssh_host_ed25519_key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host key file: %v %v", fi, err)
	}
	// A damaged key file is an error that says what to do, not a silent new key.
	if err := os.WriteFile(filepath.Join(state, "ssh_host_ed25519_key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gitserver.New(cfg, nopDirectory{}, nopAdmission{}, pl, nil, nil); err == nil || !strings.Contains(err.Error(), "remove it to generate a new one") {
		t.Fatalf("damaged host key: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := gitserver.DefaultConfig()
	cfg.StateDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.MaxUnauthPerSource, cfg.MaxSessionsPerConn, cfg.MaxEnvBytes = 0, 0, 0
	err := cfg.Validate()
	for _, want := range []string{"Config.MaxUnauthPerSource", "Config.MaxSessionsPerConn", "Config.MaxEnvBytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to name %s", err, want)
		}
	}
	// Without a state dir, every path it would give is named.
	err = gitserver.DefaultConfig().Validate()
	for _, want := range []string{"Config.HostKeyPath"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate without StateDir = %v, want it to name %s", err, want)
		}
	}
}
