package backend_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// recordingVolumes is a VolumeStore that records what reaches it.
// live: a cluster's (copies while the app runs, used bytes unknown).
type recordingVolumes struct {
	calls []string
	live  bool
}

func (r *recordingVolumes) Usage(_ context.Context, app, name string) (int64, int64, error) {
	if r.live {
		return -1, 16 << 20, nil
	}
	return 42, 16 << 20, nil
}

func (r *recordingVolumes) Backup(_ context.Context, app, name string, w io.Writer) error {
	r.calls = append(r.calls, "backup "+app+"/"+name)
	return nil
}

func (r *recordingVolumes) Pauses() bool { return !r.live }

func (r *recordingVolumes) Restore(_ context.Context, app, name string, _ io.Reader) error {
	r.calls = append(r.calls, "restore "+app+"/"+name)
	return nil
}

// TestVolumeRules: who may touch a volume (a user without access to the app
// reaches none of its volumes, by any operation), and every bad name, path,
// size and process type refused with its kind before anything is written.
func TestVolumeRules(t *testing.T) {
	store := &recordingVolumes{}
	shop := app("shop", "bob")
	shop.Spec.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("16Mi")}}
	f := newFixtureWith(t, func(c *backend.Config) { c.Volumes = store }, shop, app("other", "carol"))
	ctx := context.Background()

	// carol has no access to shop: not its list, not its data, not a change.
	_, err := f.b.Volumes(ctx, guest, "shop")
	wantKind(t, "carol lists shop's volumes", err, backend.Forbidden, "")
	wantKind(t, "carol backs up shop's volume", f.b.BackupVolume(ctx, guest, "shop", "data", io.Discard, false, nil), backend.Forbidden, "")
	wantKind(t, "carol restores shop's volume", f.b.RestoreVolume(ctx, guest, "shop", "data", strings.NewReader("x"), false, nil), backend.Forbidden, "")
	wantKind(t, "carol destroys shop's volume", f.b.DestroyVolume(ctx, guest, "shop", "data", "data"), backend.Forbidden, "")
	_, err = f.b.CreateVolume(ctx, guest, "shop", backend.VolumeRequest{Name: "x", Path: "/x"}, nil)
	wantKind(t, "carol adds a volume to shop", err, backend.Forbidden, "")
	// Nor through her own app, by the other's volume name.
	wantKind(t, "carol backs up 'data' of her app", f.b.BackupVolume(ctx, guest, "other", "data", io.Discard, false, nil), backend.NotFound, "other has no volumes")
	if len(store.calls) != 0 {
		t.Fatalf("refused requests reached the volumes: %v", store.calls)
	}

	for _, bad := range []backend.VolumeRequest{
		{Name: "../x", Path: "/data2"}, {Name: "A", Path: "/data2"}, {Name: "x/y", Path: "/data2"}, {Name: strings.Repeat("a", 31), Path: "/data2"},
		{Name: "two", Path: ""}, {Name: "two", Path: "data"}, {Name: "two", Path: "/a/../b"}, {Name: "two", Path: "/a/./b"},
		{Name: "two", Path: "/"}, {Name: "two", Path: "/proc"}, {Name: "two", Path: "/sys/fs"}, {Name: "two", Path: "/dev/shm"}, {Name: "two", Path: "/a/"},
		{Name: "two", Path: "/two", Size: "1Mi"}, {Name: "two", Path: "/two", Size: "17Ti"}, {Name: "two", Path: "/two", Size: "lots"},
		{Name: "two", Path: "/two", Processes: []string{"../web"}},
	} {
		_, err := f.b.CreateVolume(ctx, member, "shop", bad, nil)
		wantKind(t, "create "+bad.Name+" at "+bad.Path+" of "+bad.Size, err, backend.Invalid, "")
	}
	_, err = f.b.CreateVolume(ctx, member, "shop", backend.VolumeRequest{Name: "two", Path: "/two", Processes: []string{"worker"}}, nil)
	wantKind(t, "a process type the app does not have", err, backend.Invalid, `no process type "worker"`)
	_, err = f.b.CreateVolume(ctx, member, "shop", backend.VolumeRequest{Name: "data", Path: "/other"}, nil)
	wantKind(t, "the same name twice", err, backend.Conflict, "has a volume data already")
	_, err = f.b.CreateVolume(ctx, member, "shop", backend.VolumeRequest{Name: "two", Path: "/data"}, nil)
	wantKind(t, "the same path twice", err, backend.Conflict, "mounted at /data already")
	wantKind(t, "destroy without --confirm", f.b.DestroyVolume(ctx, member, "shop", "data", ""), backend.Invalid, "--confirm data")
	wantKind(t, "destroy a volume it does not have", f.b.DestroyVolume(ctx, member, "shop", "nope", "nope"), backend.NotFound, "its volumes are data")

	// Not deployed yet: made at the first deploy, listed so; its usage measured.
	in, err := f.b.CreateVolume(ctx, member, "shop", backend.VolumeRequest{Name: "two", Path: "/two", Size: "1Gi"}, nil)
	if err != nil || in.Ready || in.Message != "made at the first deploy" || in.SizeBytes != 1<<30 {
		t.Fatalf("create before the first deploy: %+v, %v", in, err)
	}
	vols, err := f.b.Volumes(ctx, member, "shop")
	if err != nil || len(vols) != 2 || vols[1].Name != "two" || vols[0].UsedBytes == nil || *vols[0].UsedBytes != 42 {
		t.Fatalf("volumes: %+v, %v", vols, err)
	}
	if err := f.b.BackupVolume(ctx, member, "shop", "data", &bytes.Buffer{}, false, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Join(store.calls, ",") != "backup shop/data" {
		t.Fatalf("calls %v", store.calls)
	}
	if !strings.Contains(f.log.String(), "command=volumes:create") || !strings.Contains(f.log.String(), "command=volumes:backup") {
		t.Errorf("no audit lines:\n%s", f.log.String())
	}
}

// TestVolumeCopiesOnAClusterSaySo: where the store does not pause the app (a
// cluster), a backup or restore of a running app is refused with one line
// naming `suspend APP` and --live; with --live it goes ahead with one line
// saying what it can miss; a suspended app's needs neither; an unknown use is
// null.
func TestVolumeCopiesOnAClusterSaySo(t *testing.T) {
	store := &recordingVolumes{live: true}
	shop := app("shop", "bob")
	shop.Spec.Image = "registry.example/shop@sha256:" + strings.Repeat("a", 64)
	shop.Spec.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("16Mi")}}
	f := newFixtureWith(t, func(c *backend.Config) { c.Volumes = store }, shop)
	ctx := context.Background()
	var notes []string
	notice := func(l string) { notes = append(notes, l) }
	err := f.b.BackupVolume(ctx, member, "shop", "data", io.Discard, false, notice)
	wantKind(t, "backup of a running app", err, backend.Conflict, "`suspend shop` first for a still copy")
	if err == nil || !strings.Contains(err.Error(), "volumes:backup shop data --live") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("the refusal: %v", err)
	}
	wantKind(t, "restore into a running app", f.b.RestoreVolume(ctx, member, "shop", "data", strings.NewReader(""), false, notice), backend.Conflict, "volumes:restore shop data --live")
	if len(notes) != 0 {
		t.Fatalf("notices of refused copies: %q", notes)
	}
	if err := f.b.BackupVolume(ctx, member, "shop", "data", io.Discard, true, notice); err != nil {
		t.Fatal(err)
	}
	if err := f.b.RestoreVolume(ctx, member, "shop", "data", strings.NewReader(""), true, notice); err != nil {
		t.Fatal(err)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "can miss writes in flight") || !strings.Contains(notes[1], "while it is restored") || strings.Contains(notes[0], "\n") {
		t.Fatalf("notices %q", notes)
	}
	vols, err := f.b.Volumes(ctx, member, "shop")
	if err != nil || len(vols) != 1 || vols[0].UsedBytes != nil || vols[0].SizeBytes != 16<<20 {
		t.Fatalf("volumes on a cluster: %+v, %v", vols, err)
	}
	if err := f.b.SetSuspended(ctx, member, "shop", true); err != nil {
		t.Fatal(err)
	}
	notes = nil
	if err := f.b.BackupVolume(ctx, member, "shop", "data", io.Discard, false, notice); err != nil || len(notes) != 0 {
		t.Fatalf("backup of a suspended app: %v, notices %q", err, notes)
	}
	if err := f.b.RestoreVolume(ctx, member, "shop", "data", strings.NewReader(""), false, notice); err != nil || len(notes) != 0 {
		t.Fatalf("restore into a suspended app: %v, notices %q", err, notes)
	}
}
