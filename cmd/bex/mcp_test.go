package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func mcpSession(t *testing.T, ctx context.Context, addr, token string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "bex-test", Version: "1"}, nil)
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}, MaxRetries: -1}, nil)
}

// call calls a tool and decodes its structured result into out; it returns the
// result for the text and the error flag.
func call(t *testing.T, ctx context.Context, s *mcp.ClientSession, tool string, args any, out any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", tool, b, err)
		}
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// errorCode is the code of a tool error as the server writes it, "CODE: MESSAGE"
// in the one text content and no structured content (which would have to match
// the tool's output schema); "" for anything else.
func errorCode(res *mcp.CallToolResult) string {
	if !res.IsError || res.StructuredContent != nil || len(res.Content) != 1 {
		return ""
	}
	code, msg, ok := strings.Cut(text(res), ": ")
	if !ok || msg == "" || strings.ContainsAny(code, " \n") {
		return ""
	}
	return code
}

// mcpTools are the MCP server's tools, sorted.
const mcpTools = "app_status audit build_logs create_database create_volume databases deploy deploy_image destroy_volume diagnose link_database list_apps logs releases resume rollback run scale set_config suspend unlink_database volumes"

// TestAgentAPI: the SDK's own MCP client, with a token from tokens:create, lists
// the tools, deploys (real buildkitd; the test plays the deployer), reads the
// status until Running, rolls back and suspends; another user's token gets
// forbidden on that app, and a revoked token is refused.
func TestAgentAPI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := startHooksEnv(t, ctx, "--allow-file-upstreams")

	upstream, head1 := e.upstreamApp(ctx, "agentapp", "", "one")
	testenv.StartFakeDeployer(ctx, t, e.cp.Client, e.ns)

	token := strings.TrimSpace(e.ssh("tokens:create", "agent"))
	s, err := mcpSession(t, ctx, e.hooksAddr, token)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer s.Close()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.InputSchema == nil || tool.OutputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s lacks a schema or description", tool.Name)
		}
	}
	slices.Sort(names)
	if strings.Join(names, " ") != mcpTools {
		t.Fatalf("tools: %v", names)
	}

	var dep mcpserver.Deployed
	res := call(t, ctx, s, "deploy", map[string]any{"app": "agentapp"}, &dep)
	if res.IsError || dep.Release != 1 || dep.Commit != head1 || !strings.Contains(text(res), "Deployed agentapp: release v1") {
		t.Fatalf("deploy: %s %+v", text(res), dep)
	}
	// deploy_image reaches the gitserver's deploy:image, with its address rule:
	// without --allow-private-registries a registry on loopback is refused.
	res = call(t, ctx, s, "deploy_image", map[string]any{"app": "agentapp", "image": "127.0.0.1:5/x/y:v1"}, nil)
	if errorCode(res) != "invalid" || !strings.Contains(text(res), "127.0.0.1 is a loopback address, which deploy:image may not pull from") {
		t.Fatalf("deploy_image from loopback: %s", text(res))
	}
	// Its verdict, the JSON after the code: nothing fetched, v1 serving on.
	var v mcpserver.Verdict
	if err := json.Unmarshal([]byte(strings.TrimPrefix(text(res), "invalid: ")), &v); err != nil || v.Status != "failed" || v.Phase != "fetch" ||
		v.Release != 0 || v.ServingRelease != 1 || v.URL != dep.URL || !strings.Contains(v.Hint, "release v1 keeps serving") {
		t.Fatalf("deploy_image from loopback: %v %s", err, text(res))
	}
	if dep.Status != "live" || dep.ServingRelease != 1 || dep.Phase != "rollout" {
		t.Fatalf("deploy's verdict: %+v", dep)
	}
	var st backend.AppInfo
	testenv.Eventually(t, 30*time.Second, "agentapp Running", func() error {
		if res = call(t, ctx, s, "app_status", map[string]any{"app": "agentapp"}, &st); st.Phase != "Running" {
			return fmt.Errorf("app_status: %+v", st)
		}
		return nil
	})
	if st.Revision != 1 || st.LastBuild == nil || st.LastBuild.Result != "succeeded" || st.LastBuild.Commit != head1 ||
		st.LastRelease == nil || st.LastRelease.Cause != "Deploy" || !strings.Contains(text(res), "agentapp is Running, serving release v1") {
		t.Fatalf("app_status: %s %+v", text(res), st)
	}
	if len(st.Processes) != 1 || st.Processes[0].Resources.Memory != "512Mi" || !st.Processes[0].Resources.Default {
		t.Fatalf("app_status processes before ps:resources: %+v", st.Processes)
	}
	if out := e.ssh("ps:resources", "agentapp", "web", "--memory", "1Gi", "--cpu", "2"); !strings.Contains(out, "Set web of agentapp to 1Gi, 2 CPU") {
		t.Fatalf("ps:resources: %q", out)
	}
	res = call(t, ctx, s, "app_status", map[string]any{"app": "agentapp"}, &st)
	if r := st.Processes[0].Resources; r.Memory != "1Gi" || r.MemoryBytes != 1<<30 || r.CPU != "2" || r.Default {
		t.Fatalf("app_status processes after ps:resources: %s %+v", text(res), st.Processes)
	}
	if out, _, err := e.bk.Containerd.Run(ctx, "bex.local/agentapp:"+head1[:12]); err != nil || out != "one" {
		t.Fatalf("the deployed image: %q %v", out, err)
	}

	head2 := commitMsg(t, upstream, "two")
	if res = call(t, ctx, s, "deploy", map[string]any{"app": "agentapp"}, &dep); res.IsError || dep.Release != 2 || dep.Commit != head2 {
		t.Fatalf("second deploy: %s", text(res))
	}
	var back mcpserver.Deployed
	res = call(t, ctx, s, "rollback", map[string]any{"app": "agentapp"}, &back)
	if res.IsError || back.Release != 3 || back.RollbackOf != 1 {
		t.Fatalf("rollback: %s %+v", text(res), back)
	}
	var rels mcpserver.ReleaseList
	call(t, ctx, s, "releases", map[string]any{"app": "agentapp"}, &rels)
	if len(rels.Releases) != 3 || rels.Releases[0].Cause != "Rollback" || !rels.Releases[0].Serving || rels.Releases[1].Actor != "admin-"+e.ns {
		t.Fatalf("releases: %+v", rels)
	}
	var logTail mcpserver.LogTail
	if res = call(t, ctx, s, "build_logs", map[string]any{"app": "agentapp"}, &logTail); res.IsError || !strings.Contains(logTail.Log, "COPY msg /msg") || logTail.Commit != head2 {
		t.Fatalf("build_logs: %s", text(res))
	}

	var sus mcpserver.Suspension
	if res = call(t, ctx, s, "suspend", map[string]any{"app": "agentapp"}, &sus); res.IsError || !sus.Suspended {
		t.Fatalf("suspend: %s", text(res))
	}
	app := &appv1.App{}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "agentapp"}, app); err != nil || !app.Spec.Suspended {
		t.Fatalf("the App is not suspended: %v", err)
	}
	if res = call(t, ctx, s, "deploy", map[string]any{"app": "agentapp", "commit": "nope"}, nil); errorCode(res) != "invalid" {
		t.Fatalf("deploy of a bad commit: %s", text(res))
	}
	if res = call(t, ctx, s, "app_status", map[string]any{"app": "nothing"}, nil); errorCode(res) != "not_found" {
		t.Fatalf("unknown app: %s", text(res))
	}

	// Another user, no member of agentapp: forbidden, and the app is not listed.
	mallory := testenv.NewSSHKey(t)
	if err := e.cp.Client.Create(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "mallory-" + e.ns}, Spec: appv1.UserSpec{
		Role: appv1.RoleMember, Keys: []appv1.SSHKey{{Name: "k", PublicKey: mallory.AuthorizedKey}}}}); err != nil {
		t.Fatal(err)
	}
	var malloryToken string
	testenv.Eventually(t, 90*time.Second, "mallory's key known", func() error {
		out, err := testenv.SSHCommand(mallory, "bex", e.sshAddr, "tokens:create", "m").Output()
		malloryToken = strings.TrimSpace(string(out))
		return err
	})
	ms, err := mcpSession(t, ctx, e.hooksAddr, malloryToken)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	for _, tool := range []string{"app_status", "deploy", "deploy_image", "resume", "rollback", "logs"} {
		res := call(t, ctx, ms, tool, map[string]any{"app": "agentapp"}, nil)
		if errorCode(res) != "forbidden" || !strings.Contains(text(res), "has no access to app agentapp") {
			t.Fatalf("mallory's %s: %s", tool, text(res))
		}
	}
	var list mcpserver.AppList
	if call(t, ctx, ms, "list_apps", nil, &list); len(list.Apps) != 0 {
		t.Fatalf("mallory lists %+v", list)
	}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "agentapp"}, app); err != nil || !app.Spec.Suspended {
		t.Fatal("mallory resumed the app")
	}

	// A revoked token, and none at all, are refused at the door.
	e.ssh("tokens:revoke", "agent")
	if _, err := mcpSession(t, ctx, e.hooksAddr, token); err == nil {
		t.Fatal("a revoked token connects")
	}
	res2, err := http.Post("http://"+e.hooksAddr+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil || res2.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %v %v", err, res2.StatusCode)
	}
}
