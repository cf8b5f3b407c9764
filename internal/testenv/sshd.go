package testenv

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// SSHD is OpenSSH's sshd (Debian's openssh-server) on a loopback port, for
// measuring bex's SSH server against the one everybody knows.
type SSHD struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
}

// StartSSHD starts /usr/sbin/sshd in the foreground with a config, host key and
// authorized_keys of its own in a temporary directory, accepting key for the user
// the tests run as. It stops with the test.
func StartSSHD(t testing.TB, key *SSHKey) *SSHD {
	t.Helper()
	bin := "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		var lerr error
		if bin, lerr = exec.LookPath("sshd"); lerr != nil {
			t.Fatalf("sshd is not installed: run `make tools` (hack/tools.sh installs openssh-server)")
		}
	}
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	authorized := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(hostKey, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(authorized, []byte(key.AuthorizedKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// sshd refuses to start without its privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("sshd's /run/sshd: %v", err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join([]string{
		fmt.Sprintf("Port %d", port),
		"ListenAddress 127.0.0.1",
		"HostKey " + hostKey,
		"AuthorizedKeysFile " + authorized,
		"PidFile none",
		"StrictModes no",
		"UsePAM no",
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"LogLevel ERROR",
	}, "\n") + "\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := startProcess(dir, "sshd", bin, []string{"-D", "-e", "-f", cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.stop(5 * time.Second) })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := p.waitReady(10*time.Second, func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "SSH-2.0-") {
			return fmt.Errorf("banner %q: %v", line, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &SSHD{Addr: addr}
}
