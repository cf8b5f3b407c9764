package main

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestTokenOfARemovedUser, as an attacker would on a live server: bob makes a
// token that never expires over the real ssh; an admin removes bob
// (users:remove) and makes a new bob of the same name (users:add): the old
// token is refused by /mcp, and the new bob's fresh token works (the
// control). A User deleted behind the gitserver's back (straight through the
// API, so its tokens stay) and made again: its token is refused too, by the
// UID it is bound to. Then, with curl: a malformed token is refused, and past
// the burst of failed tokens the source gets 429 with Retry-After, a good
// token included.
func TestTokenOfARemovedUser(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := startHooksEnv(t, ctx)
	bob := "bob-" + e.ns

	// addBob makes bob (users:add, keys:add as the admin) with a new key, and
	// returns the key once the gitserver knows it (its cache).
	addBob := func() *testenv.SSHKey {
		t.Helper()
		if out := e.ssh("users:add", bob); !strings.Contains(out, bob) {
			t.Fatalf("users:add: %s", out)
		}
		key := testenv.NewSSHKey(t)
		add := testenv.SSHCommand(e.admin, "bex", e.sshAddr, "keys:add", "laptop", "--user", bob)
		add.Stdin = strings.NewReader(key.AuthorizedKey)
		if out, err := add.CombinedOutput(); err != nil {
			t.Fatalf("keys:add: %v %s", err, out)
		}
		testenv.Eventually(t, 90*time.Second, bob+"'s key known", func() error {
			return testenv.SSHCommand(key, "bex", e.sshAddr, "whoami").Run()
		})
		return key
	}
	makeToken := func(key *testenv.SSHKey, name string) string {
		t.Helper()
		out, err := testenv.SSHCommand(key, "bex", e.sshAddr, "tokens:create", name, "--expires-in", "never").Output()
		if err != nil {
			t.Fatalf("tokens:create %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	works := func(token string) error {
		s, err := mcpSession(t, ctx, e.hooksAddr, token)
		if err != nil {
			return err
		}
		defer s.Close()
		_, err = s.ListTools(ctx, nil)
		return err
	}

	key1 := addBob()
	old := makeToken(key1, "ci")
	if err := works(old); err != nil {
		t.Fatalf("bob's token before the removal: %v", err)
	}
	if out, err := testenv.SSHCommand(key1, "bex", e.sshAddr, "tokens:list").Output(); err != nil ||
		!strings.Contains(string(out), "FINGERPRINT") || !strings.Contains(string(out), fingerprint(t, key1)) {
		t.Fatalf("tokens:list does not show the key that made the token: %v\n%s", err, out)
	}

	if out := e.ssh("users:remove", bob); !strings.Contains(out, "Removed user "+bob) {
		t.Fatalf("users:remove: %s", out)
	}
	key2 := addBob()
	if err := works(old); err == nil {
		t.Fatal("the removed bob's token works for the new bob")
	}
	// The name is free again: users:remove took the old token with it.
	fresh := makeToken(key2, "ci")
	if err := works(fresh); err != nil {
		t.Fatalf("the new bob's token (the control): %v", err)
	}

	// Deleted straight through the API, users:remove bypassed: the token's
	// Secret stays, and its UID is what refuses it.
	if err := e.cp.Client.Delete(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: bob}}); err != nil {
		t.Fatal(err)
	}
	key3 := addBob()
	testenv.Eventually(t, 30*time.Second, "the token of the deleted bob refused", func() error {
		if works(fresh) == nil {
			return fmt.Errorf("it works")
		}
		return nil
	})
	testenv.Eventually(t, 5*time.Second, "the refusal logged with its reason", e.logged("was made for an earlier user of this name"))

	// curl, from here on: status and Retry-After of a POST with a token.
	curl := func(token string) (int, string) {
		t.Helper()
		out, err := exec.Command("curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %header{retry-after}",
			"-H", "Authorization: Bearer "+token, "-H", "Content-Type: application/json",
			"-H", "Accept: application/json, text/event-stream", "--data", initializeBody, "http://"+e.hooksAddr+"/mcp").Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		code, retry, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
		n, _ := strconv.Atoi(code)
		return n, retry
	}
	// The new bob sees the stale token, marked refused, and makes another.
	if out, err := testenv.SSHCommand(key3, "bex", e.sshAddr, "tokens:list").Output(); err != nil ||
		!strings.Contains(string(out), "Token ci is refused: made for an earlier user of this name") {
		t.Fatalf("tokens:list of the new bob: %v\n%s", err, out)
	}
	newest := makeToken(key3, "ci2")
	if code, _ := curl(newest); code != http.StatusOK {
		t.Fatalf("curl with a good token: %d", code)
	}
	malformed := "bex_" + strings.Repeat("!", 43)
	if code, _ := curl(malformed); code != http.StatusUnauthorized {
		t.Fatalf("a malformed token: %d", code)
	}
	// Failed so far from 127.0.0.1: the old token, the deleted bob's (at least
	// one request each; the MCP client makes two) and the malformed one; the
	// burst is 10.
	refused := 0
	for {
		code, retry := curl(malformed)
		if code == http.StatusTooManyRequests {
			if secs, err := strconv.Atoi(retry); err != nil || secs < 1 || secs > 60 {
				t.Fatalf("429 with Retry-After %q", retry)
			}
			t.Logf("429 (Retry-After %s) after %d more malformed tokens", retry, refused)
			break
		}
		if code != http.StatusUnauthorized {
			t.Fatalf("a malformed token: %d", code)
		}
		if refused++; refused > 7 {
			t.Fatalf("%d malformed tokens refused with 401 after 3 failures, and no 429: the burst is 10", refused)
		}
	}
	if code, retry := curl(newest); code != http.StatusTooManyRequests || retry == "" {
		t.Fatalf("a good token from a source past the limit: %d %q", code, retry)
	}
}

func fingerprint(t *testing.T, k *testenv.SSHKey) string {
	t.Helper()
	pk, _, _, _, err := gossh.ParseAuthorizedKey([]byte(k.AuthorizedKey))
	if err != nil {
		t.Fatal(err)
	}
	return gossh.FingerprintSHA256(pk)
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

// TestTokenOfARemovedKey, as an attacker would on a live server: bob makes a
// token with each of his two keys over the real ssh; keys:remove of the
// laptop key (signed in with the other) revokes the laptop's token, which /mcp
// refuses from then on, while the other key's token works on (the control).
func TestTokenOfARemovedKey(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := startHooksEnv(t, ctx)
	bob := "bob-" + e.ns
	if out := e.ssh("users:add", bob); !strings.Contains(out, bob) {
		t.Fatalf("users:add: %s", out)
	}
	keys := map[string]*testenv.SSHKey{}
	for _, name := range []string{"laptop", "ci"} {
		keys[name] = testenv.NewSSHKey(t)
		add := testenv.SSHCommand(e.admin, "bex", e.sshAddr, "keys:add", name, "--user", bob)
		add.Stdin = strings.NewReader(keys[name].AuthorizedKey)
		if out, err := add.CombinedOutput(); err != nil {
			t.Fatalf("keys:add %s: %v %s", name, err, out)
		}
		testenv.Eventually(t, 90*time.Second, bob+"'s key "+name+" known", func() error {
			return testenv.SSHCommand(keys[name], "bex", e.sshAddr, "whoami").Run()
		})
	}
	tokens := map[string]string{}
	for name, key := range keys {
		out, err := testenv.SSHCommand(key, "bex", e.sshAddr, "tokens:create", "from-"+name).Output()
		if err != nil {
			t.Fatalf("tokens:create from-%s: %v", name, err)
		}
		tokens[name] = strings.TrimSpace(string(out))
	}
	works := func(token string) error {
		s, err := mcpSession(t, ctx, e.hooksAddr, token)
		if err != nil {
			return err
		}
		defer s.Close()
		_, err = s.ListTools(ctx, nil)
		return err
	}
	for name, tok := range tokens {
		if err := works(tok); err != nil {
			t.Fatalf("the token of %s before keys:remove: %v", name, err)
		}
	}
	out, err := testenv.SSHCommand(keys["ci"], "bex", e.sshAddr, "keys:remove", "laptop").Output()
	if err != nil || !strings.Contains(string(out), "the tokens made with it (1) are revoked") {
		t.Fatalf("keys:remove laptop: %v %s", err, out)
	}
	if err := works(tokens["laptop"]); err == nil {
		t.Fatal("the laptop key's token works after keys:remove laptop")
	}
	if err := works(tokens["ci"]); err != nil {
		t.Fatalf("the token of the key that stays (the control): %v", err)
	}
}
