package mcpserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/testenv"
)

// noReleases: the handler's tests deploy nothing.
type noReleases struct{ backend.Releases }

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

func post(t *testing.T, url, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initialize))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// TestBearerTokensAtTheDoor: malformed bearer tokens are refused without a
// read of the API; successes cost a source nothing; past a burst of failures a
// source gets 429 with Retry-After for every request, a good token included,
// still without a read.
func TestBearerTokensAtTheDoor(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = appv1.AddToScheme(s)
	key := testenv.NewSSHKey(t)
	fc := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "bob", UID: "uid-bob"}, Spec: appv1.UserSpec{Keys: []appv1.SSHKey{{Name: "k", PublicKey: key.AuthorizedKey}}}}).Build()
	cc := &testenv.CountingClient{WithWatch: fc}
	store := &tokens.Store{Client: cc, Users: cc, Namespace: "bex-system"}
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Namespace, bcfg.Releases, bcfg.Tokens = cc, "apps", noReleases{}, store
	b, err := backend.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcpserver.DefaultConfig()
	cfg.Backend = b
	srv, err := mcpserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	url := hs.URL + "/mcp"
	good, err := store.Create(context.Background(), tokens.Owner{User: "bob", UID: "uid-bob", KeyFingerprint: gossh.FingerprintSHA256(key.Signer.PublicKey())}, "ci", 0, tokens.Scope{})
	if err != nil {
		t.Fatal(err)
	}

	// Successes are given back: more good calls than the burst all pass.
	for i := range cfg.FailedTokens.Burst + 5 {
		if res, body := post(t, url, good); res.StatusCode != http.StatusOK {
			t.Fatalf("good call %d: %d %s", i, res.StatusCode, body)
		}
	}
	// So is a request without a token: a client's probe is no guess.
	if res, _ := post(t, url, ""); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d", res.StatusCode)
	}

	cc.Reset()
	malformed := []string{"bex_short", "bex_" + strings.Repeat("!", 43), "ghp_" + strings.Repeat("A", 43), good + "A", "bex_" + strings.Repeat("A", 42) + "B"}
	for i := range cfg.FailedTokens.Burst {
		if res, body := post(t, url, malformed[i%len(malformed)]); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("malformed token %d: %d %s", i, res.StatusCode, body)
		}
	}
	if cc.Reads() != 0 {
		t.Fatalf("malformed tokens made %d reads of the API", cc.Reads())
	}
	// The burst is spent: 429, with when to come back, for a good token too.
	for _, tok := range []string{malformed[0], good} {
		res, body := post(t, url, tok)
		secs, err := strconv.Atoi(res.Header.Get("Retry-After"))
		if res.StatusCode != http.StatusTooManyRequests || err != nil || secs < 1 || secs > 60 || !strings.Contains(body, "too many refused tokens") {
			t.Fatalf("past the burst: %d Retry-After %q %s", res.StatusCode, res.Header.Get("Retry-After"), body)
		}
	}
	if cc.Reads() != 0 {
		t.Fatalf("refusals past the limit made %d reads of the API", cc.Reads())
	}
}
