package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
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
	log := &testenv.SyncBuffer{}
	// Registered before the testbed's, this cleanup runs after them: the log
	// is whole once the server is closed.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", log.String())
		}
	})
	var reader *counting
	fake := &slow{started: make(chan string, 10), release: make(chan struct{})}
	// mcpserver's Config is the default: Recheck every 1 s.
	tb := newTestbed(t, "mcp", func(c *backend.Config) {
		reader = &counting{Reader: c.Reader, n: map[string]int{}}
		c.Reader = reader
		c.Logs, c.Deployer = fake, fake
		c.Log = slog.New(slog.NewTextHandler(log, nil))
	})

	// Each user has a key (tb.user): a token works while the key that made
	// it is there.
	users := map[string]*backend.User{}
	for base, role := range map[string]appv1.UserRole{"bob": appv1.RoleMember, "carol": appv1.RoleMember, "dave": appv1.RoleAdmin} {
		users[base] = tb.user(t, base, appv1.UserSpec{Role: role})
	}
	name := func(base string) string { return users[base].Name }
	tb.apps(t,
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Spec: appv1.AppSpec{Members: []string{name("bob"), name("carol")}}},
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "cart"}, Spec: appv1.AppSpec{Members: []string{name("bob")}}})
	// Tokens are made by a session signed in with a key (tokens:create over
	// ssh). tb.connect's cleanups run before the server's: the client
	// sessions (their open SSE streams) are closed before the server, which
	// waits for its connections.
	session := func(base string) *mcp.ClientSession { return tb.connect(t, users[base], "agent", backend.TokenScope{}) }
	start := func(s *mcp.ClientSession, tool, app string) chan callResult {
		done := make(chan callResult, 1)
		go func() {
			res, err := s.CallTool(tb.ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"app": app}})
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
		if err := tb.cp.Client.Get(tb.ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		change()
		if err := tb.cp.Client.Update(tb.ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	// access:remove shop bob, as the backend writes it.
	shop := &appv1.App{}
	edit(shop, client.ObjectKey{Namespace: tb.ns, Name: "shop"}, func() { shop.Spec.Members = []string{name("carol")} })
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
	if err := tb.cp.Client.Delete(tb.ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name("carol")}}); err != nil {
		t.Fatal(err)
	}
	took = endsWith(carolAgain, time.Now(), "forbidden: user "+name("carol")+" was removed: this session ends")
	t.Logf("removing carol ended her logs call in %v", took.Round(time.Millisecond))
}
