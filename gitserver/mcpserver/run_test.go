package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	gossh "golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/internal/testenv"
)

// loudRunner prints 100 lines of 1 KiB and "last", and exits 5.
type loudRunner struct {
	mu   sync.Mutex
	got  []backend.RunSpec
	exit int
}

func (r *loudRunner) Run(_ context.Context, s backend.RunSpec) (int, error) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
	for i := 0; i < 100; i++ {
		fmt.Fprintf(s.Stdout, "%04d %s\n", i, strings.Repeat("x", 1019))
	}
	fmt.Fprintln(s.Stderr, "last")
	return 5, nil
}

func (r *loudRunner) Start(context.Context, backend.RunSpec, func(int)) error { return nil }

func TestRunTool(t *testing.T) {
	ctx := context.Background()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "mcprun")
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, cache, err := access.Start(actx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	runner := &loudRunner{}
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Reader, bcfg.Namespace = cp.Client, cache, ns
	bcfg.Releases = &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	bcfg.Runner = runner
	bcfg.Tokens = &tokens.Store{Client: cp.Client, Users: cache, Namespace: ns}
	bcfg.Log = slog.New(slog.DiscardHandler)
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
	user := "ann-" + ns
	key := testenv.NewSSHKey(t) // a token works while the key that made it is there
	if err := cp.Client.Create(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: user}, Spec: appv1.UserSpec{Role: appv1.RoleAdmin,
		Keys: []appv1.SSHKey{{Name: "k", PublicKey: key.AuthorizedKey}}}}); err != nil {
		t.Fatal(err)
	}
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: ns}, Spec: appv1.AppSpec{Image: "bex.local/shop@sha256:" + strings.Repeat("a", 64), Release: 2}}
	if err := cp.Client.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	au := &appv1.User{}
	testenv.Eventually(t, 10*time.Second, "the cache has the user and app", func() error {
		if err := cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop"}, &appv1.App{}); err != nil {
			return err
		}
		return cache.Get(ctx, client.ObjectKey{Name: user}, au)
	})
	tok, err := b.CreateToken(ctx, backend.UserOf(au, "k", gossh.FingerprintSHA256(key.Signer.PublicKey())), "agent", "1h", backend.TokenScope{})
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "bex-test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL,
		HTTPClient: &http.Client{Transport: bearer{tok.Token, http.DefaultTransport}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"app": "shop", "command": []string{"sh", "-c", "noisy"}}})
	if err != nil || res.IsError {
		t.Fatalf("run: %v %+v", err, res)
	}
	raw, _ := json.Marshal(res.StructuredContent)
	var out mcpserver.RunOutput
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	// The tail, framed as the app's untrusted output (untrusted_test.go).
	if out.ExitCode != 5 || len(out.Output) > mcpserver.RunOutputBytes+300 || !out.Truncated || !strings.HasSuffix(out.Output, "last\n</untrusted-app-output>") || len(out.ID) != 12 {
		t.Errorf("run: exit %d, %d bytes, truncated %v, id %q, ends %q", out.ExitCode, len(out.Output), out.Truncated, out.ID, out.Output[max(0, len(out.Output)-10):])
	}
	if len(runner.got) != 1 || runner.got[0].Timeout != mcpserver.DefaultRunTimeout || runner.got[0].Release != 2 || runner.got[0].TTY != nil || runner.got[0].Stdin != nil {
		t.Errorf("spec: %+v", runner.got)
	}
	for _, args := range []map[string]any{
		{"app": "shop", "command": []string{"ls"}, "timeoutSeconds": 3601},
		{"app": "shop", "command": []string{}},
		{"app": "shop", "command": "ls"},
	} {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: args})
		if err == nil && !res.IsError {
			t.Errorf("run %v accepted", args)
		}
	}
	if len(runner.got) != 1 {
		t.Errorf("refused runs reached the runner: %d", len(runner.got))
	}
}
