package mcpserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

func TestTailBufferKeepsWholeLastLines(t *testing.T) {
	b := tailBuffer{max: 100}
	for i := range 1000 {
		fmt.Fprintf(&b, "line %04d\n", i)
	}
	got := b.String()
	if !b.cut || len(got) > 100 || !strings.HasPrefix(got, "line ") || !strings.HasSuffix(got, "line 0999\n") {
		t.Fatalf("tail %q (cut %v)", got, b.cut)
	}
	small := tailBuffer{max: 100}
	small.Write([]byte("a\nb\n"))
	if small.String() != "a\nb\n" || small.cut {
		t.Fatalf("a short log is kept whole: %q", small.String())
	}
}

// TestToolErrorIsTextWithTheCode: a refusal reaches the agent as a tool error whose
// one text content is "CODE: MESSAGE", without structured content (which would
// have to match the tool's output schema); an error without a kind is internal,
// and its cause is logged.
func TestToolErrorIsTextWithTheCode(t *testing.T) {
	var logged bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&logged, nil))}
	u := &backend.User{Name: "bob"}
	for _, c := range []struct {
		err  error
		want string
	}{
		{backend.Errorf(backend.NotFound, `no app "shop"`), `not_found: no app "shop"`},
		{fmt.Errorf("app_status: %w", backend.Errorf(backend.Forbidden, "user bob has no access to app shop")), "forbidden: app_status: user bob has no access to app shop"},
		{backend.Errorf(backend.Invalid, "bad commit"), "invalid: bad commit"},
		{backend.Errorf(backend.Conflict, "busy"), "conflict: busy"},
		{backend.Errorf(backend.Failed, "release v2 did not serve"), "failed: release v2 did not serve"},
		{errors.New("etcd is down"), "internal: etcd is down"},
	} {
		res := s.toolError("app_status", u, c.err)
		if !res.IsError || res.StructuredContent != nil || len(res.Content) != 1 {
			t.Fatalf("%v: %+v", c.err, res)
		}
		if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != c.want {
			t.Errorf("%v: content %#v, want text %q", c.err, res.Content[0], c.want)
		}
	}
	if l := logged.String(); strings.Count(l, "tool failed") != 1 || !strings.Contains(l, "etcd is down") || !strings.Contains(l, "user=bob") {
		t.Errorf("log: %s", l)
	}
}

// TestAFailureWhoseAppCannotBeReadWithholdsItsOutput: when the app's config
// cannot be read to mask what a failure quotes (access withdrawn meanwhile,
// the app gone), the quote is withheld and the first line, bex's, stays,
// cleaned; the error keeps its kind. A failure of a call that used no app is
// as it was.
func TestAFailureWhoseAppCannotBeReadWithholdsItsOutput(t *testing.T) {
	s := runtime.NewScheme()
	_ = appv1.AddToScheme(s)
	cfg := backend.DefaultConfig()
	cfg.Client, cfg.Namespace, cfg.Releases = fake.NewClientBuilder().WithScheme(s).Build(), "apps", struct{ backend.Releases }{}
	b, err := backend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{cfg: Config{Backend: b}}
	u := &backend.User{Name: "bob"}
	failure := backend.Errorf(backend.Failed, "release v2 of shop did not roll out: web.1 keeps exiting\x1b[2K; last log lines:\n\x1b[31mkey=s3cret-value\x1b[0m")
	got := srv.outputInError(context.Background(), u, []string{"shop"}, failure)
	if want := "release v2 of shop did not roll out: web.1 keeps exiting; last log lines: " + withheld; got.Error() != want || backend.KindOf(got) != backend.Failed || !errors.Is(got, failure) {
		t.Errorf("got %q (kind %s), want %q", got, backend.KindOf(got), want)
	}
	if got := srv.outputInError(context.Background(), u, nil, failure); got != failure {
		t.Errorf("a call that used no app: %v", got)
	}
}
