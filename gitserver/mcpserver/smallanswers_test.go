package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// chattyApp prints 2,000 numbered lines.
type chattyApp struct{}

func (chattyApp) Logs(_ context.Context, _ string, _ backend.LogOptions, w io.Writer) error {
	for i := range 2000 {
		fmt.Fprintf(w, "web.1[r1]: line %04d of what the app printed\n", i)
	}
	return nil
}

// TestAnswersAreSmallAndSayWhenCut, through the real MCP client on a real
// API server: list_apps and releases answer a page at a time with a cursor
// that leads through every item once, and say when more remain; logs answer
// 16 KiB of the newest lines by default, less when asked, and say they were
// cut.
func TestAnswersAreSmallAndSayWhenCut(t *testing.T) {
	tb := newTestbed(t, "mcpsmall", func(c *backend.Config) { c.Logs = chattyApp{} })
	testenv.StartFakeDeployer(tb.ctx, t, tb.cp.Client, tb.ns)
	ann := tb.user(t, "ann", appv1.UserSpec{Role: appv1.RoleMember})
	var apps []*appv1.App
	for i := range 5 {
		apps = append(apps, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app%d", i)}, Spec: appv1.AppSpec{Members: []string{ann.Name},
			Image: "bex.local/app@sha256:" + strings.Repeat("a", 64), Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}})
	}
	tb.apps(t, apps...)
	s := tb.connect(t, ann, "agent", backend.TokenScope{})

	var seen []string
	after := ""
	for range 4 {
		var page mcpserver.AppList
		text, isErr := callTool(t, s, "list_apps", map[string]any{"limit": 2, "after": after}, &page)
		if isErr {
			t.Fatal(text)
		}
		for _, a := range page.Apps {
			seen = append(seen, a.Name)
		}
		if (page.Next != "") != strings.Contains(text, "Cut: more remain") {
			t.Errorf("a page's text and next disagree: %q, next %q", text, page.Next)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if strings.Join(seen, " ") != "app0 app1 app2 app3 app4" {
		t.Errorf("the pages of list_apps: %v", seen)
	}
	if text, isErr := callTool(t, s, "list_apps", map[string]any{"limit": 1000}, nil); !isErr || !strings.HasPrefix(text, "invalid: ") {
		t.Errorf("a page of 1000: %s", text)
	}

	for i := range 3 {
		if text, isErr := callTool(t, s, "set_config", map[string]any{"app": "app0", "set": map[string]string{"N": fmt.Sprint(i)}}, nil); isErr {
			t.Fatal(text)
		}
	}
	var first, second mcpserver.ReleaseList
	if text, isErr := callTool(t, s, "releases", map[string]any{"app": "app0", "limit": 2}, &first); isErr || len(first.Releases) != 2 ||
		first.Releases[0].Number != 3 || first.Next != 2 || !strings.Contains(text, "Cut: older releases remain") {
		t.Fatalf("the first page of releases: %s %+v", text, first)
	}
	if text, isErr := callTool(t, s, "releases", map[string]any{"app": "app0", "limit": 2, "before": first.Next}, &second); isErr ||
		len(second.Releases) != 1 || second.Releases[0].Number != 1 || second.Next != 0 || strings.Contains(text, "Cut") {
		t.Fatalf("the second page of releases: %s %+v", text, second)
	}

	var tail mcpserver.LogTail
	text, isErr := callTool(t, s, "logs", map[string]any{"app": "app0"}, &tail)
	if isErr || !tail.Truncated || len(tail.Log) > 17<<10 || !strings.Contains(tail.Log, "line 1999") || strings.Contains(tail.Log, "line 0000") ||
		!strings.Contains(text, "(cut: the last 16384 bytes only") {
		t.Errorf("logs by default: truncated %v, %d bytes, text %.200q", tail.Truncated, len(tail.Log), text)
	}
	if text, isErr := callTool(t, s, "logs", map[string]any{"app": "app0", "max_bytes": 2048}, &tail); isErr || len(tail.Log) > 3<<10 || !strings.Contains(text, "the last 2048 bytes") {
		t.Errorf("logs of 2 KiB: %d bytes, text %.200q", len(tail.Log), text)
	}
	if text, isErr := callTool(t, s, "logs", map[string]any{"app": "app0", "max_bytes": 1 << 20}, nil); !isErr || !strings.HasPrefix(text, "invalid: ") {
		t.Errorf("logs of 1 MiB: %s", text)
	}
}
