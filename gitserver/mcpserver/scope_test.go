package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
)

// appLogs prints one line per app, as the runtime's logs would.
type appLogs struct{}

func (appLogs) Logs(_ context.Context, app string, _ backend.LogOptions, w io.Writer) error {
	fmt.Fprintf(w, "web.1[r1]: hello from %s\n", app)
	return nil
}

// changingArgs are arguments each changing tool accepts (its input schema
// refuses unknown fields), naming the app shop: a read-only token calls each
// with them. A changing tool missing here fails TestScopedTokens.
var changingArgs = map[string]map[string]any{
	"deploy":          {"app": "shop"},
	"deploy_image":    {"app": "shop", "image": "ghcr.io/o/shop:v1"},
	"rollback":        {"app": "shop", "to": 1},
	"suspend":         {"app": "shop"},
	"resume":          {"app": "shop"},
	"set_config":      {"app": "shop", "set": map[string]string{"A": "1"}},
	"scale":           {"app": "shop", "processes": map[string]int{"web": 2}},
	"run":             {"app": "shop", "command": []string{"true"}},
	"create_volume":   {"app": "shop", "name": "data", "path": "/data"},
	"destroy_volume":  {"app": "shop", "name": "data", "confirm": "data"},
	"create_database": {"engine": "postgres", "name": "db"},
	"link_database":   {"name": "db", "app": "shop"},
	"unlink_database": {"name": "db", "app": "shop"},
}

// TestScopedTokens, through the real MCP client over streamable HTTP on a
// real API server: bob's unlimited token and his token limited to the app
// shop are listed every tool; his read-only token is listed the reading
// tools only (readOnlyHint), and each changing tool it calls by name anyway
// is refused forbidden by the backend, the app unchanged. The token limited
// to shop lists shop only and is refused cart (bob's too) and an app of
// another user alike, forbidden; it reads shop. The controls: the unlimited
// token lists both apps and reads cart.
func TestScopedTokens(t *testing.T) {
	tb := newTestbed(t, "mcpscope", func(c *backend.Config) { c.Logs = appLogs{} })
	bob := tb.user(t, "bob", appv1.UserSpec{Role: appv1.RoleMember, CanCreateApps: true})
	app := func(name, member string) *appv1.App {
		return &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appv1.AppSpec{Members: []string{member},
			Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}}
	}
	// secret is carol's, another user's (named only: she needs no User here).
	tb.apps(t, app("shop", bob.Name), app("cart", bob.Name), app("secret", "carol-"+tb.ns))
	full := tb.connect(t, bob, "full", backend.TokenScope{})
	ro := tb.connect(t, bob, "ro", backend.TokenScope{ReadOnly: true})
	shopOnly := tb.connect(t, bob, "shop-only", backend.TokenScope{Apps: []string{"shop"}})

	tools := func(s *mcp.ClientSession) ([]string, []string) {
		t.Helper()
		res, err := s.ListTools(tb.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var reading, changing []string
		for _, tool := range res.Tools {
			if tool.Annotations == nil {
				t.Errorf("tool %s has no annotations: its effect is said at its registration", tool.Name)
				continue
			}
			if tool.Annotations.ReadOnlyHint {
				reading = append(reading, tool.Name)
			} else {
				changing = append(changing, tool.Name)
			}
		}
		slices.Sort(reading)
		slices.Sort(changing)
		return reading, changing
	}
	reading, changing := tools(full)
	if want := "app_status audit build_logs databases diagnose list_apps logs releases volumes"; strings.Join(reading, " ") != want {
		t.Errorf("the reading tools: %v, want %s", reading, want)
	}
	if len(changing) != len(changingArgs) {
		t.Errorf("the changing tools: %v; changingArgs has %d", changing, len(changingArgs))
	}
	if r, c := tools(shopOnly); !slices.Equal(r, reading) || !slices.Equal(c, changing) {
		t.Errorf("the token limited to shop is listed %v and %v, not every tool", r, c)
	}
	if r, c := tools(ro); !slices.Equal(r, reading) || len(c) != 0 {
		t.Errorf("the read-only token is listed %v and %v, want the reading tools only", r, c)
	}

	// call returns "CODE: MESSAGE" of a refusal, or "" and decodes the result
	// into out.
	call := func(s *mcp.ClientSession, tool string, args map[string]any, out any) string {
		t.Helper()
		res, err := s.CallTool(tb.ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s %v: %v", tool, args, err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if code, js, _ := strings.Cut(text, ": "); res.IsError && strings.HasPrefix(js, "{") {
			// A change that makes a release: its verdict, rejected; the
			// refusal is its message.
			v := verdictOf(t, res, code)
			if v.Status != "rejected" || v.Release != 0 || v.LogTail != "" {
				t.Errorf("%s %v: not a rejection: %s", tool, args, text)
			}
			return code + ": " + v.Message
		}
		if res.IsError {
			return text
		}
		if out != nil {
			raw, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(raw, out); err != nil {
				t.Fatal(err)
			}
		}
		return ""
	}
	appNames := func(s *mcp.ClientSession) string {
		t.Helper()
		var list mcpserver.AppList
		if got := call(s, "list_apps", nil, &list); got != "" {
			t.Fatalf("list_apps: %s", got)
		}
		var names []string
		for _, a := range list.Apps {
			names = append(names, a.Name)
		}
		return strings.Join(names, " ")
	}

	// The read-only token reads, and every change it names is refused by the
	// backend: the tool is hidden, not gone.
	shopBefore := &appv1.App{}
	if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "shop"}, shopBefore); err != nil {
		t.Fatal(err)
	}
	if got := appNames(ro); got != "cart shop" {
		t.Errorf("list_apps of the read-only token: %q", got)
	}
	if got := call(ro, "app_status", map[string]any{"app": "shop"}, nil); got != "" {
		t.Errorf("app_status of the read-only token: %s", got)
	}
	for _, tool := range changing {
		args, ok := changingArgs[tool]
		if !ok {
			t.Errorf("the changing tool %s has no arguments in changingArgs", tool)
			continue
		}
		if got := call(ro, tool, args, nil); !strings.HasPrefix(got, "forbidden: this token is read-only: ") {
			t.Errorf("%s by the read-only token: %q, want forbidden: this token is read-only: ...", tool, got)
		}
	}
	for tool, want := range map[string]string{
		"deploy":     "forbidden: this token is read-only: deploy changes something, and takes a token made without --read-only",
		"set_config": "forbidden: this token is read-only: config:set changes something, and takes a token made without --read-only",
		"scale":      "forbidden: this token is read-only: ps:scale changes something, and takes a token made without --read-only",
	} {
		if got := call(ro, tool, changingArgs[tool], nil); got != want {
			t.Errorf("%s by the read-only token: %q, want %q", tool, got, want)
		}
	}
	shopAfter := &appv1.App{}
	if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "shop"}, shopAfter); err != nil {
		t.Fatal(err)
	}
	if shopAfter.ResourceVersion != shopBefore.ResourceVersion {
		t.Errorf("shop changed under the read-only token: %+v", shopAfter.Spec)
	}

	// The token limited to shop.
	if got := appNames(shopOnly); got != "shop" {
		t.Errorf("list_apps of the token limited to shop: %q", got)
	}
	var st backend.AppInfo
	if got := call(shopOnly, "app_status", map[string]any{"app": "shop"}, &st); got != "" || st.Name != "shop" {
		t.Errorf("app_status shop: %s %+v", got, st)
	}
	var logs mcpserver.LogTail
	if got := call(shopOnly, "logs", map[string]any{"app": "shop"}, &logs); got != "" || !strings.Contains(logs.Log, "hello from shop") {
		t.Errorf("logs shop: %s %+v", got, logs)
	}
	const outside = "forbidden: this token is limited to the apps shop: %s is not one of them (a token's apps are set by tokens:create --apps)"
	for _, c := range []struct{ tool, app string }{{"app_status", "cart"}, {"logs", "cart"}, {"app_status", "secret"}, {"logs", "nope"}, {"deploy", "cart"}} {
		if got, want := call(shopOnly, c.tool, map[string]any{"app": c.app}, nil), fmt.Sprintf(outside, c.app); got != want {
			t.Errorf("%s %s by the token limited to shop: %q, want %q", c.tool, c.app, got, want)
		}
	}

	// The controls: the unlimited token.
	if got := appNames(full); got != "cart shop" {
		t.Errorf("list_apps of the unlimited token: %q", got)
	}
	if got := call(full, "logs", map[string]any{"app": "cart"}, &logs); got != "" || !strings.Contains(logs.Log, "hello from cart") {
		t.Errorf("logs cart by the unlimited token: %s %+v", got, logs)
	}
	if got := call(full, "app_status", map[string]any{"app": "secret"}, nil); !strings.HasPrefix(got, "forbidden: user "+bob.Name+" has no access to app secret") {
		t.Errorf("app_status of another user's app by the unlimited token: %q", got)
	}
}
