package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// typescriptSDK finds node and the official TypeScript MCP SDK that hack/tools.sh
// installs into bin/mcp-sdk (hack/mcp-client pins its version), or fails saying
// how to install them: this test is the proof that agents built on that SDK can
// use the server, so it never skips.
func typescriptSDK(t *testing.T) (node, modules string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: run `make tools` (hack/tools.sh installs Debian's nodejs and npm)")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	modules = filepath.Join(root, "bin", "mcp-sdk", "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed in %s: run `make tools` (hack/tools.sh installs hack/mcp-client's pinned @modelcontextprotocol/sdk): %v", modules, err)
	}
	return node, modules
}

// tsReport is what testdata/mcp_sdk_client.mjs prints: the tools and, for each
// call, the result the SDK handed back or the message it threw.
type tsReport struct {
	SDK   string `json:"sdk"`
	Tools []struct {
		Name         string          `json:"name"`
		OutputSchema json.RawMessage `json:"outputSchema"`
	} `json:"tools"`
	Calls []struct {
		Name   string `json:"name"`
		MS     int    `json:"ms"`
		Threw  string `json:"threw"`
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		} `json:"result"`
	} `json:"calls"`
}

// TestAgentAPIWithTheTypeScriptSDK: the official TypeScript SDK's client, which
// checks each structured result against the tool's output schema, lists the tools,
// reads list_apps, app_status and releases of an app, and gets app_status of an unknown app
// handed back as a tool error with the not_found code, where it once threw
// "Structured content does not match the tool's output schema" (the error used to
// travel as structured content that the schema does not describe). It takes a
// dry run's plan and reads the audit trail of its own change (its token, client
// and reason) and diagnose; a read-only token is listed the reading tools and
// refused a change it names anyway, and a token limited to one app lists that
// app alone and is refused another.
func TestAgentAPIWithTheTypeScriptSDK(t *testing.T) {
	node, modules := typescriptSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := startHooksEnv(t, ctx)
	e.ssh("apps:create", "tsapp")
	token := strings.TrimSpace(e.ssh("tokens:create", "ts"))

	calls, _ := json.Marshal([]map[string]any{
		{"name": "list_apps", "arguments": map[string]any{}},
		{"name": "app_status", "arguments": map[string]any{"app": "tsapp"}},
		{"name": "app_status", "arguments": map[string]any{"app": "nothing"}},
		// An app without releases: an empty list, which the schema must allow.
		{"name": "releases", "arguments": map[string]any{"app": "tsapp"}},
		// A change that makes a release: its verdict, the structured result
		// (checked by the SDK against the schema) on success, the JSON after
		// the code of a tool error when refused.
		{"name": "set_config", "arguments": map[string]any{"app": "tsapp", "set": map[string]string{"MODE": "fast"}}},
		{"name": "deploy", "arguments": map[string]any{"app": "tsapp", "commit": "nope"}},
		// A dry run: its plan in the structured result, which the schema
		// must allow, and nothing changed (the audit below has no entry of
		// it); then the change for real, with a reason.
		{"name": "set_config", "arguments": map[string]any{"app": "tsapp", "set": map[string]string{"MODE": "slow"}, "dry_run": true, "reason": "see first"}},
		{"name": "set_config", "arguments": map[string]any{"app": "tsapp", "set": map[string]string{"MODE": "slow"}, "reason": "from typescript"}},
		{"name": "audit", "arguments": map[string]any{"app": "tsapp"}},
		{"name": "diagnose", "arguments": map[string]any{"app": "tsapp"}},
	})
	r := runTypeScriptClient(t, ctx, node, modules, "http://"+e.hooksAddr+"/mcp", token, calls)

	if !strings.HasPrefix(r.SDK, "1.32.") {
		t.Errorf("SDK %s, want 1.32.x (hack/mcp-client/package.json)", r.SDK)
	}
	var names []string
	for _, tool := range r.Tools {
		names = append(names, tool.Name)
		if len(tool.OutputSchema) == 0 {
			t.Errorf("tool %s has no output schema: the SDK would check nothing", tool.Name)
		}
	}
	slices.Sort(names)
	if strings.Join(names, " ") != mcpTools {
		t.Fatalf("tools: %v", names)
	}
	if len(r.Calls) != 10 {
		t.Fatalf("calls: %+v", r.Calls)
	}
	for _, c := range r.Calls {
		t.Logf("%s took %d ms", c.Name, c.MS)
		if c.Threw != "" {
			t.Fatalf("the SDK threw on %s instead of handing back its result: %s", c.Name, c.Threw)
		}
	}

	list, status, unknown, rels := r.Calls[0].Result, r.Calls[1].Result, r.Calls[2].Result, r.Calls[3].Result
	var apps struct {
		Apps []struct {
			Name string `json:"name"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(list.StructuredContent, &apps); list.IsError || err != nil || len(apps.Apps) != 1 || apps.Apps[0].Name != "tsapp" {
		t.Fatalf("list_apps: %+v %s (%v)", list, list.StructuredContent, err)
	}
	var st struct {
		Name         string `json:"name"`
		DeployBranch string `json:"deployBranch"`
		Revision     *int64 `json:"revision"`
	}
	if err := json.Unmarshal(status.StructuredContent, &st); status.IsError || err != nil || st.Name != "tsapp" || st.DeployBranch == "" ||
		st.Revision == nil || *st.Revision != 0 || len(status.Content) == 0 || !strings.Contains(status.Content[0].Text, "tsapp") {
		t.Fatalf("app_status of tsapp: %+v %s (%v)", status, status.StructuredContent, err)
	}
	// The error: the code first in the text, and no structured content, which would
	// have to match AppStatus' schema.
	if !unknown.IsError || len(unknown.Content) != 1 || unknown.Content[0].Type != "text" ||
		!strings.HasPrefix(unknown.Content[0].Text, "not_found: ") || !strings.Contains(unknown.Content[0].Text, "nothing") {
		t.Fatalf("app_status of an unknown app: %+v", unknown)
	}
	if len(unknown.StructuredContent) != 0 {
		t.Fatalf("app_status of an unknown app has structured content %s", unknown.StructuredContent)
	}
	var releases struct {
		Releases []json.RawMessage `json:"releases"`
	}
	if err := json.Unmarshal(rels.StructuredContent, &releases); rels.IsError || err != nil || len(releases.Releases) != 0 {
		t.Fatalf("releases of tsapp: %+v %s (%v)", rels, rels.StructuredContent, err)
	}

	// set_config before the first deploy: no release, the verdict live.
	config, refused := r.Calls[4].Result, r.Calls[5].Result
	var kept mcpserver.Deployed
	if err := json.Unmarshal(config.StructuredContent, &kept); config.IsError || err != nil || kept.App != "tsapp" || kept.Status != "live" ||
		kept.Release != 0 || kept.ServingRelease != 0 || kept.Hint == "" {
		t.Fatalf("set_config of tsapp: %+v %s (%v)", config, config.StructuredContent, err)
	}
	// deploy of a bad commit: "invalid: " and exactly the verdict's JSON,
	// rejected, no structured content.
	var v mcpserver.Verdict
	js, ok := strings.CutPrefix(refused.Content[0].Text, "invalid: ")
	dec := json.NewDecoder(strings.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); !refused.IsError || len(refused.Content) != 1 || len(refused.StructuredContent) != 0 || !ok || err != nil || dec.More() ||
		v.Status != "rejected" || v.Phase != "fetch" || !strings.Contains(v.Message, `commit "nope"`) || v.Hint == "" {
		t.Fatalf("deploy of a bad commit: %+v (%v)", refused, err)
	}

	// The dry run: its plan, the config key it would change, no value.
	dry := r.Calls[6].Result
	var planned mcpserver.Deployed
	if err := json.Unmarshal(dry.StructuredContent, &planned); dry.IsError || err != nil || planned.Status != "dry_run" || planned.Plan == nil ||
		planned.Plan.Config == nil || !slices.Equal(planned.Plan.Config.Changed, []string{"MODE"}) || strings.Contains(string(dry.StructuredContent), "slow") {
		t.Fatalf("set_config's dry run: %+v %s (%v)", dry, dry.StructuredContent, err)
	}
	// The audit: the change for real and the ssh command that made the
	// app, with the way, token, client and reason; the dry run is not in it.
	trail := r.Calls[8].Result
	var page backend.AuditPage
	if err := json.Unmarshal(trail.StructuredContent, &page); trail.IsError || err != nil {
		t.Fatalf("audit: %+v (%v)", trail, err)
	}
	var got []string
	for _, e := range page.Entries {
		got = append(got, fmt.Sprintf("%s %s %s %s %s", e.Command, e.Via, e.Token, e.Client, e.Reason))
	}
	want := []string{"config:set mcp ts bex-test-typescript 1 from typescript", "config:set mcp ts bex-test-typescript 1 ", "apps:create ssh   "}
	if !slices.Equal(got, want) {
		t.Fatalf("audit of tsapp:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var d mcpserver.Diagnosis
	if diag := r.Calls[9].Result; diag.IsError || json.Unmarshal(diag.StructuredContent, &d) != nil || d.App != "tsapp" || len(d.NextTools) == 0 {
		t.Fatalf("diagnose of tsapp: %+v", diag)
	}

	// The scoped tokens, with the same client: a read-only token is listed
	// the reading tools only, and a change it names anyway is refused; a
	// token limited to tsapp lists tsapp alone and is refused another app.
	e.ssh("apps:create", "tsother")
	reader := strings.TrimSpace(e.ssh("tokens:create", "ts-reader", "--read-only"))
	calls, _ = json.Marshal([]map[string]any{
		{"name": "set_config", "arguments": map[string]any{"app": "tsapp", "set": map[string]string{"MODE": "x"}}},
		{"name": "app_status", "arguments": map[string]any{"app": "tsapp"}},
	})
	ro := runTypeScriptClient(t, ctx, node, modules, "http://"+e.hooksAddr+"/mcp", reader, calls)
	var roTools []string
	for _, tool := range ro.Tools {
		roTools = append(roTools, tool.Name)
	}
	slices.Sort(roTools)
	if strings.Join(roTools, " ") != "app_status audit build_logs databases diagnose list_apps logs releases volumes" {
		t.Errorf("the read-only token's tools: %v", roTools)
	}
	if c := ro.Calls[0]; c.Threw != "" || c.Result == nil || !c.Result.IsError || !strings.Contains(c.Result.Content[0].Text, "this token is read-only") {
		t.Errorf("set_config with the read-only token: %+v", c)
	}
	if c := ro.Calls[1]; c.Threw != "" || c.Result == nil || c.Result.IsError {
		t.Errorf("app_status with the read-only token: %+v", c)
	}
	scoped := strings.TrimSpace(e.ssh("tokens:create", "ts-tsapp", "--apps", "tsapp"))
	calls, _ = json.Marshal([]map[string]any{
		{"name": "list_apps", "arguments": map[string]any{}},
		{"name": "app_status", "arguments": map[string]any{"app": "tsother"}},
	})
	sc := runTypeScriptClient(t, ctx, node, modules, "http://"+e.hooksAddr+"/mcp", scoped, calls)
	if len(sc.Tools) != len(r.Tools) {
		t.Errorf("the token limited to tsapp is listed %d tools, the full one %d", len(sc.Tools), len(r.Tools))
	}
	if c := sc.Calls[0]; c.Threw != "" || c.Result == nil || c.Result.IsError || !strings.Contains(string(c.Result.StructuredContent), `"tsapp"`) ||
		strings.Contains(string(c.Result.StructuredContent), "tsother") {
		t.Errorf("list_apps with the token limited to tsapp: %+v", c)
	}
	if c := sc.Calls[1]; c.Threw != "" || c.Result == nil || !c.Result.IsError || !strings.HasPrefix(c.Result.Content[0].Text, "forbidden: this token is limited to the apps tsapp") {
		t.Errorf("app_status of tsother with the token limited to tsapp: %+v", c)
	}
}

// runTypeScriptClient runs testdata/mcp_sdk_client.mjs with token (in the
// environment, off the command line) against the MCP endpoint url, making
// calls, and returns its report.
func runTypeScriptClient(t *testing.T, ctx context.Context, node, modules, url, token string, calls []byte) tsReport {
	t.Helper()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "mcp_sdk_client.mjs"), modules, url, "-", string(calls))
	cmd.Env = append(os.Environ(), "BEX_TOKEN="+token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the TypeScript client: %v\n%s", err, stderr.String())
	}
	t.Logf("the TypeScript client ran in %s", time.Since(start).Round(time.Millisecond))
	var r tsReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("the TypeScript client's report %q: %v\n%s", out, err, stderr.String())
	}
	return r
}
