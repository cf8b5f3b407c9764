package backend_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"bex.co/bex/gitserver/backend"
)

// fakeStorage records what the backend asks of Storage.
type fakeStorage struct {
	asked  [][]backend.StorageApp
	pruned []bool
}

func (f *fakeStorage) Usage(_ context.Context, apps []backend.StorageApp, platform bool) (*backend.DiskUsage, error) {
	f.asked = append(f.asked, apps)
	du := &backend.DiskUsage{}
	for _, a := range apps {
		du.Apps = append(du.Apps, backend.AppUsage{App: a.Name, Bytes: 7, Kinds: backend.Bytes{Repository: 7}})
	}
	return du, nil
}

func (f *fakeStorage) Prune(_ context.Context, apps []backend.StorageApp, dryRun bool) (*backend.PruneReport, error) {
	f.asked = append(f.asked, apps)
	f.pruned = append(f.pruned, dryRun)
	return &backend.PruneReport{DryRun: dryRun, Items: []backend.PruneItem{{App: "shop", Kind: "images", What: "x", Bytes: 5}}, Bytes: 5}, nil
}

// system:df and system:prune are an admin's; without a Storage they say, in
// one line, that this server measures no machine; with one, each app goes to
// it with the images its Releases and its spec keep.
func TestDiskUsageRules(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, deployed(app("shop", "bob")), app("blog"))
	_, err := f.b.DiskUsage(ctx, admin)
	wantKind(t, "system:df without Storage", err, backend.Invalid, "system:df measures the state dir of one machine (bex up)")
	_, err = f.b.Prune(ctx, admin, false)
	wantKind(t, "system:prune without Storage", err, backend.Invalid, "system:prune measures the state dir of one machine")
	_, err = f.b.DiskUsage(ctx, member)
	wantKind(t, "system:df by a member", err, backend.Forbidden, "system:df is for admins, and bob is not one")
	_, err = f.b.Prune(ctx, member, true)
	wantKind(t, "system:prune by a member", err, backend.Forbidden, "system:prune is for admins, and bob is not one")
	if in, err := f.b.App(ctx, member, "shop"); err != nil || in.Disk != nil {
		t.Errorf("apps:info without Storage: %v, disk %+v", err, in.Disk)
	}

	st := &fakeStorage{}
	f = newFixtureWith(t, func(c *backend.Config) { c.Storage = st }, deployed(app("shop", "bob")), app("blog"))
	r := release("shop", 2, "")
	r.Spec.Image = "bex.local/shop@sha256:" + strings.Repeat("b", 64)
	f.rel.rels = append(f.rel.rels, r)
	if _, err := f.b.DiskUsage(ctx, member); backend.KindOf(err) != backend.Forbidden || len(st.asked) != 0 {
		t.Errorf("a member's system:df reached Storage: %v, %d calls", err, len(st.asked))
	}
	du, err := f.b.DiskUsage(ctx, admin)
	if err != nil || len(du.Apps) != 2 {
		t.Fatalf("system:df: %v %+v", err, du)
	}
	got := st.asked[0]
	if len(got) != 2 || got[0].Name != "blog" || got[1].Name != "shop" ||
		!slices.Contains(got[1].Keep, r.Spec.Image) || !slices.Contains(got[1].Keep, deployed(app("shop")).Spec.Image) {
		t.Errorf("Storage was asked for %+v, want both apps, shop keeping its release's and its spec's image", got)
	}
	if _, err := f.b.Prune(ctx, admin, true); err != nil || strings.Contains(f.log.String(), "command=system:prune") {
		t.Errorf("system:prune --dry-run: %v; it changes nothing, so no audit line:\n%s", err, f.log.String())
	}
	if rep, err := f.b.Prune(ctx, admin, false); err != nil || rep.Bytes != 5 || !strings.Contains(f.log.String(), "command=system:prune") {
		t.Errorf("system:prune: %v %+v, log:\n%s", err, rep, f.log.String())
	}
	// apps:info: the app's own row, for a member of it.
	in, err := f.b.App(ctx, member, "shop")
	if err != nil || in.Disk == nil || in.Disk.App != "shop" || in.Disk.Bytes != 7 {
		t.Errorf("apps:info: %v, disk %+v", err, in.Disk)
	}
}
