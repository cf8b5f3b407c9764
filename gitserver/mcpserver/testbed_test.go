package mcpserver_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/testenv"
)

// testbed is a backend and its MCP server on the shared API server, in a
// namespace of the test's: a real access cache, release recorder, token
// store and audit trail; the other parts of the backend's config are the
// test's (configure).
type testbed struct {
	ctx   context.Context
	cp    *testenv.ControlPlane
	ns    string
	cache client.Reader
	b     *backend.Backend
	trail *audit.Store
	url   string
}

func newTestbed(t *testing.T, prefix string, configure func(*backend.Config)) *testbed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, prefix)
	_, cache, err := access.Start(ctx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	trail, err := audit.Open(audit.DefaultOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { trail.Close() })
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Reader, bcfg.Namespace, bcfg.ConfigSecrets = cp.Client, cache, ns, cp.Client
	bcfg.Releases = &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	bcfg.Tokens = &tokens.Store{Client: cp.Client, Users: cache, Namespace: ns}
	bcfg.Audit = trail
	bcfg.RolloutTimeout = 30 * time.Second
	bcfg.Log = slog.New(slog.DiscardHandler)
	if configure != nil {
		configure(&bcfg)
	}
	b, err := backend.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	mcfg := mcpserver.DefaultConfig()
	mcfg.Backend, mcfg.Log = b, bcfg.Log
	srv, err := mcpserver.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &testbed{ctx: ctx, cp: cp, ns: ns, cache: cache, b: b, trail: trail, url: hs.URL}
}

// user makes the user name (suffixed with the namespace) with spec and an
// ssh key, and returns it as a session signed in with that key would have it.
func (tb *testbed) user(t *testing.T, name string, spec appv1.UserSpec) *backend.User {
	t.Helper()
	name += "-" + tb.ns
	key := testenv.NewSSHKey(t)
	spec.Keys = []appv1.SSHKey{{Name: "k", PublicKey: key.AuthorizedKey}}
	if err := tb.cp.Client.Create(tb.ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	au := &appv1.User{}
	testenv.Eventually(t, 10*time.Second, "the cache has "+name, func() error {
		return tb.cache.Get(tb.ctx, client.ObjectKey{Name: name}, au)
	})
	return backend.UserOf(au, "k", gossh.FingerprintSHA256(key.Signer.PublicKey()))
}

// apps makes the apps and waits for the cache to have them.
func (tb *testbed) apps(t *testing.T, apps ...*appv1.App) {
	t.Helper()
	for _, a := range apps {
		a.Namespace = tb.ns
		if err := tb.cp.Client.Create(tb.ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the cache has the apps", func() error {
		for _, a := range apps {
			if err := tb.cache.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: a.Name}, &appv1.App{}); err != nil {
				return err
			}
		}
		return nil
	})
}

// connect makes u a token named name with scope and connects an MCP client
// (named bex-test, version 1) with it.
func (tb *testbed) connect(t *testing.T, u *backend.User, name string, scope backend.TokenScope) *mcp.ClientSession {
	t.Helper()
	tok, err := tb.b.CreateToken(tb.ctx, u, name, "1h", scope)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "bex-test", Version: "1"}, nil)
	s, err := c.Connect(tb.ctx, &mcp.StreamableClientTransport{Endpoint: tb.url,
		HTTPClient: &http.Client{Transport: bearer{tok.Token, http.DefaultTransport}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// callTool calls tool with args: the result's text, and its structured
// content decoded into out when it is not an error.
func callTool(t *testing.T, s *mcp.ClientSession, tool string, args map[string]any, out any) (text string, isError bool) {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	var parts []string
	for _, c := range res.Content {
		parts = append(parts, c.(*mcp.TextContent).Text)
	}
	if !res.IsError && out != nil {
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	return strings.Join(parts, "\n"), res.IsError
}
