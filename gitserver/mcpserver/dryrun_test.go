package mcpserver_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// mustNotRun is the builder, the image importer and the one-off runner of a
// test where nothing may reach them: each call fails the test.
type mustNotRun struct{ t *testing.T }

func (m mustNotRun) Deploy(context.Context, backend.DeployRequest) (*backend.DeployResult, error) {
	m.t.Error("a dry run reached the builder")
	return nil, backend.Errorf(backend.Failed, "must not run")
}

func (m mustNotRun) DeployImage(context.Context, backend.ImageRequest) (*backend.DeployResult, error) {
	m.t.Error("a dry run reached the image importer")
	return nil, backend.Errorf(backend.Failed, "must not run")
}

func (m mustNotRun) Run(context.Context, backend.RunSpec) (int, error) {
	m.t.Error("a dry run reached the one-off runner")
	return 1, nil
}

func (m mustNotRun) Start(context.Context, backend.RunSpec, func(int)) error {
	m.t.Error("a dry run reached the one-off runner")
	return nil
}

// TestDryRunsChangeNothing, through the real MCP client on a real API server
// (a real release recorder; the deployer played by testenv's): every changing
// tool takes dry_run and answers what it would change — the config keys of a
// set_config (never a value), the release a rollback brings back with its
// image and config difference, the replicas of a scale, the volume a
// destroy_volume deletes, the database a create_database makes, the var a
// link adds — and afterwards the App, its releases, the databases and the
// audit trail are as they were; the builder, the importer and the runner are
// never called. A dry run is refused what the call is (a read-only token, a
// link that does not exist). The control: the same set_config without
// dry_run makes its release.
func TestDryRunsChangeNothing(t *testing.T) {
	tb := newTestbed(t, "mcpdry", func(c *backend.Config) {
		c.Deployer, c.Images, c.Runner = mustNotRun{t}, mustNotRun{t}, mustNotRun{t}
	})
	testenv.StartFakeDeployer(tb.ctx, t, tb.cp.Client, tb.ns)
	ann := tb.user(t, "ann", appv1.UserSpec{Role: appv1.RoleMember, CanCreateApps: true})
	tb.apps(t, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Spec: appv1.AppSpec{
		Members: []string{ann.Name}, Image: "bex.local/shop@sha256:" + strings.Repeat("a", 64),
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}},
		Env:       []appv1.EnvVar{{Name: "A", Value: "alpha-value"}},
		Volumes:   []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("64Mi")}},
	}})
	db := &appv1.Database{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: tb.ns}, Spec: appv1.DatabaseSpec{Engine: appv1.EnginePostgres,
		Size: resource.MustParse("1Gi"), Instances: 1, Members: []string{ann.Name}}}
	if err := tb.cp.Client.Create(tb.ctx, db); err != nil {
		t.Fatal(err)
	}
	db.Status.Host, db.Status.Port = "db.internal", 5432
	if err := tb.cp.Client.Status().Update(tb.ctx, db); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the cache has the database's host", func() error {
		c := &appv1.Database{}
		if err := tb.cache.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "db"}, c); err != nil {
			return err
		}
		if c.Status.Host == "" {
			return context.DeadlineExceeded
		}
		return nil
	})
	s := tb.connect(t, ann, "agent", backend.TokenScope{})

	// Two releases for real: v1 with B, v2 with C too.
	for _, set := range []map[string]string{{"B": "two"}, {"C": "three"}} {
		var d mcpserver.Deployed
		if text, isErr := callTool(t, s, "set_config", map[string]any{"app": "shop", "set": set}, &d); isErr || d.Status != "live" {
			t.Fatalf("set_config %v: %s", set, text)
		}
	}

	type snapshot struct {
		version  string
		releases int
		dbs      int
		entries  int
	}
	snap := func() snapshot {
		t.Helper()
		a := &appv1.App{}
		if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: "shop"}, a); err != nil {
			t.Fatal(err)
		}
		rels := &appv1.ReleaseList{}
		if err := tb.cp.Client.List(tb.ctx, rels, client.InNamespace(tb.ns)); err != nil {
			t.Fatal(err)
		}
		dbs := &appv1.DatabaseList{}
		if err := tb.cp.Client.List(tb.ctx, dbs, client.InNamespace(tb.ns)); err != nil {
			t.Fatal(err)
		}
		entries, _, err := tb.trail.List(audit.Query{Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		return snapshot{a.ResourceVersion, len(rels.Items), len(dbs.Items), len(entries)}
	}
	ro := tb.connect(t, ann, "reader", backend.TokenScope{ReadOnly: true})
	before := snap()
	if before.releases != 2 {
		t.Fatalf("%d releases, want 2", before.releases)
	}

	dry := func(tool string, args map[string]any) *backend.Plan {
		t.Helper()
		args["dry_run"], args["reason"] = true, "checking before the change"
		var out struct {
			Status string        `json:"status"`
			Plan   *backend.Plan `json:"plan"`
		}
		text, isErr := callTool(t, s, tool, args, &out)
		if isErr {
			t.Fatalf("dry run of %s: %s", tool, text)
		}
		if out.Plan == nil || !out.Plan.DryRun || !strings.HasPrefix(text, "Dry run of "+tool) {
			t.Fatalf("dry run of %s: no plan: %s", tool, text)
		}
		if strings.Contains(text, "alpha-value") || strings.Contains(text, "nine-value") {
			t.Errorf("dry run of %s shows a config value: %s", tool, text)
		}
		return out.Plan
	}

	p := dry("set_config", map[string]any{"app": "shop", "set": map[string]string{"A": "nine-value", "D": "four"}, "unset": []string{"B"}})
	if p.Release != 3 || p.ServingRelease != 2 || !slices.Equal(p.Config.Added, []string{"D"}) ||
		!slices.Equal(p.Config.Changed, []string{"A"}) || !slices.Equal(p.Config.Removed, []string{"B"}) {
		t.Errorf("set_config's plan: %+v %+v", p, p.Config)
	}
	p = dry("rollback", map[string]any{"app": "shop"})
	if p.RollbackTo == nil || p.RollbackTo.Number != 1 || p.Image == "" || !slices.Equal(p.Config.Removed, []string{"C"}) || p.Release != 3 {
		t.Errorf("rollback's plan: %+v %+v", p, p.Config)
	}
	p = dry("scale", map[string]any{"app": "shop", "processes": map[string]int{"web": 3}})
	if !slices.Equal(p.Scale, []backend.ScaleChange{{Process: "web", From: 1, To: 3}}) {
		t.Errorf("scale's plan: %+v", p)
	}
	p = dry("destroy_volume", map[string]any{"app": "shop", "name": "data"})
	if p.Volume == nil || p.Volume.Name != "data" || len(p.Changes) != 1 || !strings.Contains(p.Changes[0], "delete the volume data") {
		t.Errorf("destroy_volume's plan: %+v", p)
	}
	p = dry("create_volume", map[string]any{"app": "shop", "name": "more", "path": "/more"})
	if p.Volume == nil || p.Volume.Name != "more" || len(p.Changes) != 1 {
		t.Errorf("create_volume's plan: %+v", p)
	}
	p = dry("suspend", map[string]any{"app": "shop"})
	if len(p.Changes) != 1 || !strings.Contains(p.Changes[0], "stop every process") {
		t.Errorf("suspend's plan: %+v", p)
	}
	if p = dry("resume", map[string]any{"app": "shop"}); len(p.Changes) != 0 {
		t.Errorf("resume of a running app would change %v", p.Changes)
	}
	p = dry("deploy", map[string]any{"app": "shop"})
	if p.Branch != "main" || p.Release != 3 || p.ServingRelease != 2 {
		t.Errorf("deploy's plan: %+v", p)
	}
	p = dry("deploy_image", map[string]any{"app": "shop", "image": "ghcr.io/o/shop:v2"})
	if p.Image != "ghcr.io/o/shop:v2" || p.Release != 3 {
		t.Errorf("deploy_image's plan: %+v", p)
	}
	p = dry("run", map[string]any{"app": "shop", "command": []string{"rake", "db:migrate"}})
	if !slices.Equal(p.Command, []string{"rake", "db:migrate"}) {
		t.Errorf("run's plan: %+v", p)
	}
	p = dry("create_database", map[string]any{"engine": "postgres", "name": "other"})
	if p.Database == nil || p.Database.Name != "other" {
		t.Errorf("create_database's plan: %+v", p)
	}
	p = dry("link_database", map[string]any{"name": "db", "app": "shop"})
	if p.Config == nil || !slices.Equal(p.Config.Added, []string{"DATABASE_URL"}) || p.Release != 3 {
		t.Errorf("link_database's plan: %+v", p)
	}
	// Refused as the call itself is.
	if text, isErr := callTool(t, s, "unlink_database", map[string]any{"name": "db", "app": "shop", "dry_run": true}, nil); !isErr || !strings.HasPrefix(text, "not_found: ") {
		t.Errorf("a dry run of an unlink of what is not linked: %s", text)
	}
	if text, isErr := callTool(t, s, "create_database", map[string]any{"engine": "postgres", "name": "db", "dry_run": true}, nil); !isErr || !strings.HasPrefix(text, "conflict: ") {
		t.Errorf("a dry run of a create_database whose name is taken: %s", text)
	}
	if text, isErr := callTool(t, ro, "set_config", map[string]any{"app": "shop", "set": map[string]string{"A": "x"}, "dry_run": true}, nil); !isErr || !strings.Contains(text, "forbidden") {
		t.Errorf("a read-only token's dry run: %s", text)
	}

	if after := snap(); after != before {
		t.Errorf("the dry runs changed something: before %+v, after %+v", before, after)
	}

	// The control: without dry_run the same change is made.
	var d mcpserver.Deployed
	if text, isErr := callTool(t, s, "set_config", map[string]any{"app": "shop", "set": map[string]string{"A": "nine-value"}}, &d); isErr || d.Release != 3 || d.Plan != nil {
		t.Fatalf("set_config: %s", text)
	}
	if after := snap(); after.releases != 3 || after.entries != before.entries+1 {
		t.Errorf("the change made %d releases and %d audit entries, want 3 and %d", after.releases, after.entries, before.entries+1)
	}
}
