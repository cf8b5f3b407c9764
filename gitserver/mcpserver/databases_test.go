package mcpserver_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// TestDatabaseTools: databases, create_database, link_database,
// unlink_database and app_status's linked databases, each acting as its
// token's user on a real API server: the creator is the database's member, a
// non-member is told what an unknown database would tell, a link is a
// reference to the credentials and no password is ever in a result.
func TestDatabaseTools(t *testing.T) {
	tb := newTestbed(t, "mcpdb", func(c *backend.Config) {
		c.RolloutTimeout = 20 * time.Second
		// The Secrets are not read for masking (as in a cluster): a password
		// in a result would show as itself, not redacted, to the checks below.
		c.ConfigSecrets = nil
	})

	// session is an agent holding a token of a new member named base.
	session := func(base string) (*mcp.ClientSession, string) {
		t.Helper()
		u := tb.user(t, base, appv1.UserSpec{Role: appv1.RoleMember, CanCreateApps: true})
		return tb.connect(t, u, "agent", backend.TokenScope{}), u.Name
	}
	ann, annName := session("ann")
	cat, _ := session("cat")

	// call calls a tool that must succeed and decodes its structured result
	// into out; it returns the text.
	call := func(s *mcp.ClientSession, tool string, args map[string]any, out any) string {
		t.Helper()
		res, err := s.CallTool(tb.ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s %v: %v %+v", tool, args, err, res)
		}
		raw, _ := json.Marshal(res.StructuredContent)
		if strings.Contains(string(raw), dbPassword) {
			t.Errorf("%s shows the password: %s", tool, raw)
		}
		if out != nil {
			if err := json.Unmarshal(raw, out); err != nil {
				t.Fatal(err)
			}
		}
		return res.Content[0].(*mcp.TextContent).Text
	}
	// refused calls a tool that must fail and returns its "CODE: MESSAGE".
	refused := func(s *mcp.ClientSession, tool string, args map[string]any) string {
		t.Helper()
		res, err := s.CallTool(tb.ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil || !res.IsError {
			t.Fatalf("%s %v succeeded: %v %+v", tool, args, err, res)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}

	var made backend.DatabaseInfo
	text := call(ann, "create_database", map[string]any{"engine": "postgres", "name": "shop", "size": "256Mi"}, &made)
	if made.Name != "shop" || made.Status != "Pending" || made.Size != "256Mi" || len(made.Members) != 1 || made.Members[0] != annName ||
		!strings.Contains(text, "Creating the postgres database shop (256Mi)") {
		t.Fatalf("create_database: %q %+v", text, made)
	}
	if got := refused(ann, "create_database", map[string]any{"engine": "mysql", "name": "x"}); got != `invalid: "mysql" is not a database engine: use postgres or redis` {
		t.Errorf("create_database of another engine: %q", got)
	}
	if got := refused(ann, "create_database", map[string]any{"engine": "redis", "name": "Bad"}); !strings.HasPrefix(got, `invalid: "Bad" is not a database name`) {
		t.Errorf("create_database with a bad name: %q", got)
	}
	var list mcpserver.DatabaseList
	if text := call(ann, "databases", nil, &list); len(list.Databases) != 1 || list.Databases[0].Name != "shop" || text != "1 databases: shop (postgres, Pending)." {
		t.Errorf("ann's databases: %q %+v", text, list)
	}
	if text := call(cat, "databases", nil, &list); len(list.Databases) != 0 || text != "You may use no databases." {
		t.Errorf("cat's databases: %q %+v", text, list)
	}

	// The deployer's part: the server runs, the credentials are written.
	db := &appv1.Database{}
	if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "shop"}, db); err != nil {
		t.Fatal(err)
	}
	db.Status = appv1.DatabaseStatus{Phase: appv1.DatabaseRunning, Host: "127.0.0.1", Port: 15432, Version: "16.4", Image: "bex.local/postgres@sha256:" + strings.Repeat("c", 64)}
	if err := tb.cp.Client.Status().Update(tb.ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := tb.cp.Client.Create(tb.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bex-db-shop", Namespace: tb.ns},
		Data: map[string][]byte{appv1.CredentialPassword: []byte(dbPassword), appv1.CredentialURL: []byte("postgres://shop:" + dbPassword + "@127.0.0.1:15432/shop")}}); err != nil {
		t.Fatal(err)
	}
	tb.apps(t, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "notes"}, Spec: appv1.AppSpec{Members: []string{annName},
		Image: "bex.local/notes@sha256:" + strings.Repeat("a", 64)}})
	testenv.StartFakeDeployer(tb.ctx, t, tb.cp.Client, tb.ns)
	testenv.Eventually(t, 10*time.Second, "shop running", func() error {
		if text := call(ann, "databases", nil, &list); !strings.Contains(text, "Running") {
			return errors.New(text)
		}
		return nil
	})

	// A non-member's link is answered as for a database that does not exist.
	hidden := refused(cat, "link_database", map[string]any{"name": "shop", "app": "notes"})
	unknown := refused(cat, "link_database", map[string]any{"name": "shoq", "app": "notes"})
	if !strings.HasPrefix(hidden, `not_found: no database "shop"`) || strings.ReplaceAll(unknown, "shoq", "shop") != hidden {
		t.Errorf("another's database %q, an unknown one %q", hidden, unknown)
	}
	if got := refused(ann, "link_database", map[string]any{"name": "shop"}); got != "invalid: the argument app is required" {
		t.Errorf("link_database without an app: %q", got)
	}

	var linked mcpserver.DatabaseLinked
	text = call(ann, "link_database", map[string]any{"name": "shop", "app": "notes"}, &linked)
	if linked.Release != 1 || len(linked.Vars) != 1 || linked.Vars[0] != "DATABASE_URL" || linked.URL == "" ||
		!strings.HasPrefix(text, "Linked shop to notes as DATABASE_URL: release v1 serves at") {
		t.Fatalf("link_database: %q %+v", text, linked)
	}
	a := &appv1.App{}
	if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "notes"}, a); err != nil {
		t.Fatal(err)
	}
	if env := a.Spec.Env; len(env) != 1 || env[0].Value != "" || env[0].ValueFrom == nil || *env[0].ValueFrom != (appv1.SecretKeySelector{Name: "bex-db-shop", Key: "url"}) {
		t.Errorf("notes' env after link_database: %+v", env)
	}
	// app_status reads the app from the cache, a moment behind the release.
	var st backend.AppInfo
	testenv.Eventually(t, 10*time.Second, "app_status names shop", func() error {
		text := call(ann, "app_status", map[string]any{"app": "notes"}, &st)
		if len(st.Databases) != 1 || st.Databases[0] != "shop" || !strings.Contains(text, "; linked to the databases shop") {
			return fmt.Errorf("app_status: %q %+v", text, st.Databases)
		}
		return nil
	})

	text = call(ann, "unlink_database", map[string]any{"name": "shop", "app": "notes"}, &linked)
	if linked.Release != 2 || len(linked.Vars) != 1 || linked.Vars[0] != "DATABASE_URL" || !strings.HasPrefix(text, "Unlinked shop from notes (DATABASE_URL): release v2 serves at") {
		t.Fatalf("unlink_database: %q %+v", text, linked)
	}
	testenv.Eventually(t, 10*time.Second, "app_status names no database", func() error {
		if text := call(ann, "app_status", map[string]any{"app": "notes"}, &st); len(st.Databases) != 0 || strings.Contains(text, "databases") {
			return fmt.Errorf("app_status after the unlink: %q %+v", text, st.Databases)
		}
		return nil
	})
	if got := refused(ann, "unlink_database", map[string]any{"name": "shop", "app": "notes"}); !strings.HasPrefix(got, "not_found: notes is not linked to shop") {
		t.Errorf("unlink_database of what is not linked: %q", got)
	}
}

// dbPassword is the password of the test's credentials Secret.
const dbPassword = "pw-Zx8vQ1mR4tL0"
