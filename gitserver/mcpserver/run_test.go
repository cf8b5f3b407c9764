package mcpserver_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
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
	runner := &loudRunner{}
	tb := newTestbed(t, "mcprun", func(c *backend.Config) { c.Runner = runner })
	u := tb.user(t, "ann", appv1.UserSpec{Role: appv1.RoleAdmin})
	tb.apps(t, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Spec: appv1.AppSpec{Image: "bex.local/shop@sha256:" + strings.Repeat("a", 64), Release: 2}})
	s := tb.connect(t, u, "agent", backend.TokenScope{})

	var out mcpserver.RunOutput
	if text, isError := callTool(t, s, "run", map[string]any{"app": "shop", "command": []string{"sh", "-c", "noisy"}}, &out); isError {
		t.Fatalf("run: %s", text)
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
		res, err := s.CallTool(tb.ctx, &mcp.CallToolParams{Name: "run", Arguments: args})
		if err == nil && !res.IsError {
			t.Errorf("run %v accepted", args)
		}
	}
	if len(runner.got) != 1 {
		t.Errorf("refused runs reached the runner: %d", len(runner.got))
	}
}
