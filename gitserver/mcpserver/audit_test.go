package mcpserver_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/testenv"
)

// servingDeploys is the push pipeline of a deploy that serves: release n+1.
type servingDeploys struct{ n int64 }

func (d *servingDeploys) Deploy(_ context.Context, req backend.DeployRequest) (*backend.DeployResult, error) {
	d.n++
	return &backend.DeployResult{Release: d.n, Commit: strings.Repeat("c", 40), URL: "https://" + req.App + ".example"}, nil
}

// TestAuditTrail, through the real MCP client on a real API server: changes
// from each way in — an agent's set_config and scale with a reason, a key
// session's suspend (ssh), a webhook's redeploy, a push's deploy (git) — are
// in the audit tool's answer, newest first, each with its user, way, token
// and client names, reason and releases before and after; pages follow the
// cursor; a token limited to one app sees that app's entries only, and is
// refused another's trail; a read-only token reads the trail.
func TestAuditTrail(t *testing.T) {
	deploys := &servingDeploys{n: 10}
	tb := newTestbed(t, "mcpaudit", func(c *backend.Config) { c.Deployer = deploys })
	testenv.StartFakeDeployer(tb.ctx, t, tb.cp.Client, tb.ns)
	ann := tb.user(t, "ann", appv1.UserSpec{Role: appv1.RoleMember})
	img := "bex.local/app@sha256:" + strings.Repeat("a", 64)
	tb.apps(t,
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Spec: appv1.AppSpec{Members: []string{ann.Name}, Image: img,
			Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}},
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "cart"}, Spec: appv1.AppSpec{Members: []string{ann.Name}, Image: img,
			Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}})
	agent := tb.connect(t, ann, "deployer-bot", backend.TokenScope{})

	if text, isErr := callTool(t, agent, "set_config", map[string]any{"app": "shop", "set": map[string]string{"A": "1"}, "reason": "turn the feature on"}, nil); isErr {
		t.Fatal(text)
	}
	if text, isErr := callTool(t, agent, "scale", map[string]any{"app": "cart", "processes": map[string]int{"web": 2}, "reason": "more traffic"}, nil); isErr {
		t.Fatal(text)
	}
	if err := tb.b.SetSuspended(tb.ctx, ann, "cart", true); err != nil { // ssh: a key's session
		t.Fatal(err)
	}
	if err := tb.b.Redeploy(tb.ctx, "shop", "github", "delivery-1"); err != nil {
		t.Fatal(err)
	}
	tb.b.Pushed(ann, "shop", backend.PushDone{Commit: strings.Repeat("d", 40), Branch: "main", Before: 11, Release: 12})

	var page backend.AuditPage
	if text, isErr := callTool(t, agent, "audit", map[string]any{}, &page); isErr {
		t.Fatal(text)
	}
	var got []string
	for _, e := range page.Entries {
		if e.Command == "tokens:create" {
			continue
		}
		got = append(got, e.Command+" "+e.App+" "+e.Via)
	}
	want := []string{"git push shop git", "webhook shop webhook", "suspend cart ssh", "ps:scale cart mcp", "config:set shop mcp"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("the trail: %q, want %q", got, want)
	}
	byCommand := map[string]backend.AuditEntry{}
	for _, e := range page.Entries {
		byCommand[e.Command] = e
	}
	if e := byCommand["config:set"]; e.User != ann.Name || e.Token != "deployer-bot" || e.Client != "bex-test 1" || e.Reason != "turn the feature on" ||
		e.ReleaseBefore != 0 || e.ReleaseAfter != 1 || e.Outcome != "ok" || e.Details["set"] != "A" {
		t.Errorf("config:set's entry: %+v", e)
	}
	if e := byCommand["ps:scale"]; e.Reason != "more traffic" || e.Details["scale"] != "web=2" {
		t.Errorf("ps:scale's entry: %+v", e)
	}
	if e := byCommand["suspend"]; e.Token != "" || e.Client != "" || e.Details["key"] != "k" {
		t.Errorf("suspend's entry (a key's session): %+v", e)
	}
	if e := byCommand["webhook"]; e.User != "webhook:github" || e.ReleaseAfter != 11 || e.Details["delivery"] != "delivery-1" {
		t.Errorf("the webhook's entry: %+v", e)
	}
	if e := byCommand["git push"]; e.ReleaseBefore != 11 || e.ReleaseAfter != 12 || e.Details["branch"] != "main" {
		t.Errorf("the push's entry: %+v", e)
	}

	// Pages: two entries, then the rest from the cursor.
	var first, rest backend.AuditPage
	if text, isErr := callTool(t, agent, "audit", map[string]any{"app": "shop", "limit": 2}, &first); isErr || len(first.Entries) != 2 || first.Next == 0 {
		t.Fatalf("a first page of 2: %s %+v", text, first)
	} else if !strings.Contains(text, "Cut: older entries remain") {
		t.Errorf("a cut page does not say so: %s", text)
	}
	if text, isErr := callTool(t, agent, "audit", map[string]any{"app": "shop", "before": first.Next}, &rest); isErr || len(rest.Entries) != 1 ||
		rest.Entries[0].Command != "config:set" || rest.Next != 0 {
		t.Fatalf("the next page: %s %+v", text, rest)
	}

	// Scoped as every read.
	shopOnly := tb.connect(t, ann, "shop-only", backend.TokenScope{Apps: []string{"shop"}, ReadOnly: true})
	var scoped backend.AuditPage
	if text, isErr := callTool(t, shopOnly, "audit", map[string]any{}, &scoped); isErr {
		t.Fatal(text)
	}
	for _, e := range scoped.Entries {
		if e.App != "shop" {
			t.Errorf("the token limited to shop sees %+v", e)
		}
	}
	if len(scoped.Entries) != 3 {
		t.Errorf("the token limited to shop sees %d entries, want shop's 3", len(scoped.Entries))
	}
	if text, isErr := callTool(t, shopOnly, "audit", map[string]any{"app": "cart"}, nil); !isErr || !strings.HasPrefix(text, "forbidden: ") {
		t.Errorf("the token limited to shop reads cart's trail: %s", text)
	}
}
