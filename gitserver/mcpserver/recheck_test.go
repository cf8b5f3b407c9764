package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
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

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// slow stands for the runtime's logs and the push pipeline when they take
// long (a slow log read, a deploy waiting for the app's lock): each call says
// it started, then waits for release or for its context to end.
type slow struct {
	started chan string
	release chan struct{}
}

func (s *slow) wait(ctx context.Context, what string) error {
	s.started <- what
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.release:
		return nil
	}
}

func (s *slow) Logs(ctx context.Context, app string, _ backend.LogOptions, w io.Writer) error {
	fmt.Fprintf(w, "web.1[r1]: hello from %s\n", app)
	return s.wait(ctx, "logs "+app)
}

func (s *slow) Deploy(ctx context.Context, req backend.DeployRequest) (*backend.DeployResult, error) {
	if err := s.wait(ctx, "deploy "+req.App); err != nil {
		return nil, err
	}
	return &backend.DeployResult{Release: 1}, nil
}

// counting counts the cache reads of each object by name: what the rechecks do.
type counting struct {
	client.Reader
	mu sync.Mutex
	n  map[string]int
}

func (c *counting) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	c.n[fmt.Sprintf("%T/%s", obj, key.Name)]++
	c.mu.Unlock()
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c *counting) reads(obj client.Object, name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[fmt.Sprintf("%T/%s", obj, name)]
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

type callResult struct {
	res *mcp.CallToolResult
	err error
}

// TestWithdrawnAccessEndsToolCalls: tool calls still running (a slow log read,
// a deploy waiting) of a user whose access to the app is taken away, or of an
// admin demoted, end within 2 s with a forbidden error saying why, through the
// real MCP client over streamable HTTP; the calls of another member on the
// app, and of the same user on another app, go on and succeed.
func TestWithdrawnAccessEndsToolCalls(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "mcp")
	_, cache, err := access.Start(ctx, access.Config{Namespace: ns}, cp.Config, cp.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	reader := &counting{Reader: cache, n: map[string]int{}}
	fake := &slow{started: make(chan string, 10), release: make(chan struct{})}
	log := &testenv.SyncBuffer{}
	bcfg := backend.DefaultConfig()
	bcfg.Client, bcfg.Reader, bcfg.Namespace = cp.Client, reader, ns
	bcfg.Releases = &releases.Recorder{Client: cp.Client, Namespace: ns, PollInterval: 20 * time.Millisecond}
	bcfg.Logs, bcfg.Deployer = fake, fake
	bcfg.Tokens = &tokens.Store{Client: cp.Client, Users: cache, Namespace: ns}
	bcfg.Log = slog.New(slog.NewTextHandler(log, nil))
	b, err := backend.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	mcfg := mcpserver.DefaultConfig() // Recheck: the default, 1 s
	mcfg.Backend, mcfg.Log = b, bcfg.Log
	srv, err := mcpserver.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	// Cleanups run last first: the client sessions (their open SSE streams) are
	// closed before the server, which waits for its connections.
	t.Cleanup(func() {
		hs.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", log.String())
		}
	})

	name := func(base string) string { return base + "-" + ns }
	// Each user has a key: a token works while the key that made it is there.
	keys := map[string]*testenv.SSHKey{}
	for base, role := range map[string]appv1.UserRole{"bob": appv1.RoleMember, "carol": appv1.RoleMember, "dave": appv1.RoleAdmin} {
		keys[base] = testenv.NewSSHKey(t)
		if err := cp.Client.Create(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name(base)}, Spec: appv1.UserSpec{Role: role,
			Keys: []appv1.SSHKey{{Name: "k", PublicKey: keys[base].AuthorizedKey}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for app, members := range map[string][]string{"shop": {name("bob"), name("carol")}, "cart": {name("bob")}} {
		if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns}, Spec: appv1.AppSpec{Members: members}}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the cache has the users and apps", func() error {
		for _, k := range []struct {
			obj  client.Object
			name string
		}{{&appv1.User{}, name("bob")}, {&appv1.User{}, name("carol")}, {&appv1.User{}, name("dave")}, {&appv1.App{}, "shop"}, {&appv1.App{}, "cart"}} {
			if err := cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: k.name}, k.obj); err != nil {
				return err
			}
		}
		return nil
	})
	session := func(base string) *mcp.ClientSession {
		au := &appv1.User{}
		if err := cache.Get(ctx, client.ObjectKey{Name: name(base)}, au); err != nil {
			t.Fatal(err)
		}
		// Tokens are made by a session signed in with a key (tokens:create over ssh).
		tok, err := b.CreateToken(ctx, backend.UserOf(au, "k", gossh.FingerprintSHA256(keys[base].Signer.PublicKey())), "agent", "1h", backend.TokenScope{})
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
		return s
	}
	start := func(s *mcp.ClientSession, tool, app string) chan callResult {
		done := make(chan callResult, 1)
		go func() {
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"app": app}})
			done <- callResult{res, err}
		}()
		select {
		case what := <-fake.started:
			if what != tool+" "+app {
				t.Fatalf("started %q, want %s %s", what, tool, app)
			}
		case r := <-done:
			t.Fatalf("%s %s ended at once: %+v %v", tool, app, r.res, r.err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %s did not start", tool, app)
		}
		return done
	}
	bob, carol, dave := session("bob"), session("carol"), session("dave")
	bobShop := start(bob, "logs", "shop")
	bobCart := start(bob, "logs", "cart")
	carolShop := start(carol, "logs", "shop")
	daveShop := start(dave, "deploy", "shop")

	endsWith := func(done chan callResult, since time.Time, want string) time.Duration {
		t.Helper()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("the call failed as a call: %v", r.err)
			}
			var text string
			if len(r.res.Content) == 1 {
				if tc, ok := r.res.Content[0].(*mcp.TextContent); ok {
					text = tc.Text
				}
			}
			if !r.res.IsError || text != want {
				t.Fatalf("the call ended with %+v %q; want the tool error %q", r.res, text, want)
			}
		case <-time.After(2*time.Second - time.Since(since)):
			t.Fatalf("the call still runs 2s after the change")
		}
		return time.Since(since)
	}
	edit := func(obj client.Object, key client.ObjectKey, change func()) {
		t.Helper()
		if err := cp.Client.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		change()
		if err := cp.Client.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	// access:remove shop bob, as the backend writes it.
	shop := &appv1.App{}
	edit(shop, client.ObjectKey{Namespace: ns, Name: "shop"}, func() { shop.Spec.Members = []string{name("carol")} })
	took := endsWith(bobShop, time.Now(), "forbidden: your access to shop was removed: this session ends")
	t.Logf("access:remove ended bob's logs call in %v", took.Round(time.Millisecond))

	// An admin demoted (the User edited, as with kubectl): the deploy waiting
	// on an app dave is no member of ends.
	dv := &appv1.User{}
	edit(dv, client.ObjectKey{Name: name("dave")}, func() { dv.Spec.Role = appv1.RoleMember })
	took = endsWith(daveShop, time.Now(), "forbidden: "+name("dave")+" is no longer an admin, and not a member of shop: this session ends")
	t.Logf("demoting dave ended his deploy call in %v", took.Round(time.Millisecond))

	// The controls: carol's call on shop and bob's on cart were checked again
	// twice since (each recheck reads its user, and bob's the app cart) and go on.
	carolReads, cartReads := reader.reads(&appv1.User{}, name("carol")), reader.reads(&appv1.App{}, "cart")
	testenv.Eventually(t, 10*time.Second, "two more rechecks of the other calls", func() error {
		if c, a := reader.reads(&appv1.User{}, name("carol"))-carolReads, reader.reads(&appv1.App{}, "cart")-cartReads; c < 2 || a < 2 {
			return fmt.Errorf("%d rechecks of carol's call, %d of bob's call on cart", c, a)
		}
		return nil
	})
	for what, done := range map[string]chan callResult{"carol's logs shop": carolShop, "bob's logs cart": bobCart} {
		select {
		case r := <-done:
			t.Fatalf("%s ended: %+v %v", what, r.res, r.err)
		default:
		}
	}
	// Let them finish: they succeed.
	close(fake.release)
	for what, done := range map[string]chan callResult{"carol's logs shop": carolShop, "bob's logs cart": bobCart} {
		r := <-done
		if r.err != nil || r.res.IsError {
			t.Fatalf("%s: %+v %v", what, r.res, r.err)
		}
		if tc, ok := r.res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "1 log lines of") {
			t.Fatalf("%s: %+v", what, r.res.Content)
		}
	}

	// A removed user's call ends too.
	fake.release = make(chan struct{})
	carolAgain := start(carol, "logs", "shop")
	if err := cp.Client.Delete(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name("carol")}}); err != nil {
		t.Fatal(err)
	}
	took = endsWith(carolAgain, time.Now(), "forbidden: user "+name("carol")+" was removed: this session ends")
	t.Logf("removing carol ended her logs call in %v", took.Round(time.Millisecond))
}
