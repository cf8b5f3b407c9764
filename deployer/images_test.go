package deployer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/internal/testenv"
)

// withImages is the fake runtime (instant or scripted rollouts) with the local
// runtime's real image removal against the real containerd.
type withImages struct {
	*fakeRuntime
	images runtime.Images
}

func (w withImages) RemoveImages(ctx context.Context, repo string, remove, keep []string) ([]string, error) {
	return w.images.RemoveImages(ctx, repo, remove, keep)
}

func (w withImages) RemoveRepository(ctx context.Context, repo string, refs []string) (bool, error) {
	return w.images.RemoveRepository(ctx, repo, refs)
}

// store reads what containerd's namespace holds: image names, content bytes,
// overlayfs snapshots.
type store struct {
	t  *testing.T
	cd *testenv.Containerd
}

func (s store) names(prefix string) []string {
	s.t.Helper()
	cl, err := s.cd.Client()
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	imgs, err := cl.ImageService().List(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, i := range imgs {
		if strings.HasPrefix(i.Name, prefix) {
			out = append(out, i.Name)
		}
	}
	sort.Strings(out)
	return out
}

func (s store) usage() (bytes int64, snaps int) {
	s.t.Helper()
	cl, err := s.cd.Client()
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.ContentStore().Walk(ctx, func(i content.Info) error { bytes += i.Size; return nil }); err != nil {
		s.t.Fatal(err)
	}
	if err := cl.SnapshotService("overlayfs").Walk(ctx, func(context.Context, snapshots.Info) error { snaps++; return nil }); err != nil {
		s.t.Fatal(err)
	}
	return bytes, snaps
}

func (s store) has(name string) bool {
	s.t.Helper()
	cl, err := s.cd.Client()
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.GetImage(context.Background(), name)
	if err != nil && !errdefs.IsNotFound(err) {
		s.t.Fatal(err)
	}
	return err == nil
}

// An app deployed 17 times with KeepReleases 5 ends with the images of its 5
// kept releases in containerd, 6 while a rollout is stuck behind an older serving
// release; the content and snapshots of the others are gone. Images of other
// names in the same namespace (another app whose name begins with this one's,
// another repository, a name of another repository on a pruned release's very
// digest) are untouched, and a pruned release whose image a kept release uses
// again keeps it.
func TestPrunedReleasesTakeTheirImages(t *testing.T) {
	cd := testenv.SharedContainerd(t)
	cp := testenv.SharedControlPlane(t)
	rt, err := local.New(local.Config{Address: cd.Address, Namespace: testenv.Namespace, StateDir: t.TempDir(), PortMin: 26000, PortMax: 26099},
		cp.Client, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	const keep = 5
	cfg := DefaultConfig()
	cfg.KeepReleases, cfg.ImageRepo = keep, "bex.local"
	e := startWith(t, cfg, func(f *fakeRuntime) runtime.Runtime { return withImages{f, rt} })
	e.create("imgs")
	st := store{t, cd}
	ctx := context.Background()

	// Random, so that the compressed layer is as big as the file.
	payload := func(i int) []byte {
		p := make([]byte, 256<<10)
		r := rand.New(rand.NewPCG(uint64(i), 0))
		for j := range p {
			p[j] = byte(r.Uint32())
		}
		return p
	}
	tiny := func(name string, p []byte) string {
		t.Helper()
		d, err := testenv.ImportTinyImage(ctx, cd, name, p)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The controls, made before any release.
	tiny("bex.local/imgs-2:c1", payload(101))
	tiny("docker.io/library/control:1", payload(102))
	tiny("docker.io/library/alias:1", payload(1)) // release 1's digest, another name
	bytes0, snaps0 := st.usage()

	digests := map[int]string{}
	deploy := func(i int, d string) {
		t.Helper()
		if _, err := e.rec.Record(ctx, "imgs", releases.Change{Image: "bex.local/imgs@" + d, Cause: appv1.ReleaseCausePush}); err != nil {
			t.Fatal(err)
		}
	}
	maxSeen := 0
	settled := func(what string, want []string) {
		t.Helper()
		e.eventually(what, func() error {
			got := st.names("bex.local/imgs:")
			maxSeen = max(maxSeen, len(got))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("images %v, want %v", got, want)
			}
			return nil
		})
	}
	names := func(from, to int, extra ...int) []string {
		var out []string
		for i := from; i <= to; i++ {
			out = append(out, fmt.Sprintf("bex.local/imgs:c%d", i))
		}
		for _, i := range extra {
			out = append(out, fmt.Sprintf("bex.local/imgs:c%d", i))
		}
		sort.Strings(out)
		return out
	}
	for i := 1; i <= 12; i++ {
		digests[i] = tiny(fmt.Sprintf("bex.local/imgs:c%d", i), payload(i))
		deploy(i, digests[i])
		settled(fmt.Sprintf("release %d: the images of the %d newest", i, min(i, keep)), names(max(1, i-keep+1), i))
		if n := len(st.names("bex.local/imgs:")); n > keep {
			t.Fatalf("release %d: %d images", i, n)
		}
	}
	bytes12, snaps12 := st.usage()

	// A rollout stuck behind release 12: 13 to 17 are the five newest, and 12
	// serves, so its image stays too (KeepReleases + 1).
	e.rt.set("imgs", func(d runtime.Desired) runtime.Status {
		return runtime.Status{Serving: 12, Processes: map[string]runtime.ProcessStatus{"web": {Desired: 1}}}
	})
	for i := 13; i <= 17; i++ {
		digests[i] = tiny(fmt.Sprintf("bex.local/imgs:c%d", i), payload(i))
		deploy(i, digests[i])
	}
	settled("stuck rollout: five newest and the serving one", names(13, 17, 12))
	// It ends: 12 goes.
	e.rt.set("imgs", nil)
	settled("rolled out: five newest", names(13, 17))

	// Release 18 brings back release 13's image (a push of that commit): when
	// 13 is pruned its image stays, used by 18.
	deploy(18, digests[13])
	e.eventually("release 13 pruned", func() error {
		rels, err := e.rec.List(ctx, "imgs")
		if err != nil {
			return err
		}
		if len(rels) != keep || rels[len(rels)-1].Spec.Number != 14 {
			return fmt.Errorf("%d releases, oldest %d", len(rels), rels[len(rels)-1].Spec.Number)
		}
		return nil
	})
	settled("13's image kept for 18", names(13, 17))

	// The controls.
	for _, n := range []string{"bex.local/imgs-2:c1", "docker.io/library/control:1", "docker.io/library/alias:1"} {
		if !st.has(n) {
			t.Errorf("%s was removed", n)
		}
	}
	bytesEnd, snapsEnd := st.usage()
	t.Logf("images bex.local/imgs:*: 17 made, at most %d at once, %d at the end; content %d bytes with the controls, %d after 12 releases, %d at the end (each image about %d KiB); overlayfs snapshots %d, %d, %d",
		maxSeen, len(st.names("bex.local/imgs:")), bytes0, bytes12, bytesEnd, len(payload(0))>>10, snaps0, snaps12, snapsEnd)
	// Five images of about 256 KiB each beyond the controls: 12 released, 7
	// removed with their content (release 1's layer stays, held by alias:1).
	if grown := bytes12 - bytes0; grown < 4*256<<10 || grown > 6*256<<10 {
		t.Errorf("content grew by %d bytes over 12 releases, want about 5 images' worth", grown)
	}
	if snaps12-snaps0 != keep {
		t.Errorf("snapshots grew by %d over 12 releases, want %d", snaps12-snaps0, keep)
	}
	if maxSeen > keep+1 {
		t.Errorf("%d images at once, want at most %d", maxSeen, keep+1)
	}
}
