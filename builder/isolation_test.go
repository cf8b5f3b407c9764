package builder_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/internal/testenv"
)

// secret is what a host directory holds in these tests: it must never reach a build
// log, an error or an image.
const secret = "HOST-SECRET-7f3a9c"

// hostDir is a directory of the host, outside every repository, with a Dockerfile
// that would print the secret if a build ever used it.
func hostDir(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "marker"), []byte(secret+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM busybox\nCOPY marker /marker\nRUN cat /marker\n"), 0o644)
	return dir
}

// commitWithLinks commits files and the symbolic links links (name → target).
func (r *repo) commitWithLinks(files, links map[string]string) string {
	r.t.Helper()
	for name, target := range links {
		p := filepath.Join(r.dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(target, p); err != nil {
			r.t.Fatal(err)
		}
	}
	return r.commit(files)
}

// gitStdin runs git with stdin in the repository.
func (r *repo) gitStdin(stdin string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = r.dir
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "HOME="+r.dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co")
	out, err := cmd.Output()
	if err != nil {
		r.t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

type treeEntry = testenv.TreeEntry

// mktree writes a tree of the entries as given, duplicates included, with
// hash-object --literally: git mktree and fsck would refuse it, a pushed pack need
// not.
func (r *repo) mktree(entries ...treeEntry) string {
	r.t.Helper()
	return r.gitStdin(string(testenv.RawTree(r.t, entries...)), "hash-object", "-w", "-t", "tree", "--literally", "--stdin")
}

func assertNoImage(t *testing.T, bk *testenv.Buildkitd, req builder.Request) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := bk.Containerd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.GetImage(ctx, localName(req)); err == nil {
		t.Fatalf("image %s exists after a refused build", localName(req))
	}
}

func TestABuildDirectoryThatIsALinkIsRefused(t *testing.T) {
	b, bk := newBuilder(t)
	host := hostDir(t)
	r := newRepo(t, map[string]string{"README": "monorepo\n", "real/Dockerfile": "FROM busybox\n"})
	r.commitWithLinks(nil, map[string]string{"web": host, "rel": "real", "up": "../../../../../../../../../../.." + host})
	for _, tc := range []struct{ dir, want string }{
		{"web", `build directory "web" is a symbolic link; point the build at a real directory of the repository`},
		{"web/", `build directory "web/" is a symbolic link; point the build at a real directory of the repository`},
		{"up", `build directory "up" is a symbolic link; point the build at a real directory of the repository`},
		// A link inside the tree is refused too: the setting names a place, and a
		// link could be changed by a later push to lead elsewhere.
		{"rel", `build directory "rel" is a symbolic link; point the build at a real directory of the repository`},
		{"web/sub", `build directory "web/sub" is below "web", a symbolic link; point the build at a real directory of the repository`},
		{"../x", `build directory "../x" leaves the repository; give a path inside it, such as web`},
		{"README", `build directory "README" is not a directory in commit`},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			req := r.request("linkdir")
			req.Dir = tc.dir
			_, out, err := build(t, b, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q\n%s", err, tc.want, out)
			}
			if strings.Contains(out, secret) || strings.Contains(err.Error(), secret) {
				t.Fatalf("the host's file reached the build:\n%s", out)
			}
			assertNoImage(t, bk, req)
		})
	}
	// The real directory builds, so the refusals above are the links'.
	req := r.request("linkdir")
	req.Dir = "real"
	mustBuild(t, b, req)
}

func TestADockerfileThatIsALinkIsRefused(t *testing.T) {
	b, bk := newBuilder(t)
	host := hostDir(t)
	for _, tc := range []struct {
		name       string
		links      map[string]string
		dockerfile string
		want       string
	}{
		{"to the host", map[string]string{"Dockerfile": filepath.Join(host, "Dockerfile")}, "",
			`Dockerfile "Dockerfile" is a symbolic link; put the Dockerfile itself in the repository`},
		{"inside the tree", map[string]string{"Dockerfile": "docker/Dockerfile.real"}, "",
			`Dockerfile "Dockerfile" is a symbolic link; put the Dockerfile itself in the repository`},
		{"below a link", map[string]string{"dockerlink": host}, "dockerlink/Dockerfile",
			`Dockerfile "dockerlink/Dockerfile" is below a symbolic link; put the Dockerfile in a real directory of the repository`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t, map[string]string{"docker/Dockerfile.real": "FROM busybox\n", "index.html": "hi\n"})
			r.commitWithLinks(nil, tc.links)
			req := r.request("linkdf")
			req.Dockerfile = tc.dockerfile
			_, out, err := build(t, b, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q\n%s", err, tc.want, out)
			}
			if strings.Contains(out, secret) {
				t.Fatalf("the host's file reached the build:\n%s", out)
			}
			assertNoImage(t, bk, req)
		})
	}
}

func TestATreeWithALinkAndADirectoryOfOneNameIsRefused(t *testing.T) {
	b, bk := newBuilder(t)
	host := t.TempDir()
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n"})
	g := func(stdin string, args ...string) string {
		t.Helper()
		return r.gitStdin(stdin, args...)
	}
	file := g("written through the link\n", "hash-object", "-w", "--stdin")
	link := g(host, "hash-object", "-w", "--stdin")
	df := g("FROM busybox\n", "hash-object", "-w", "--stdin")
	inner := r.mktree(treeEntry{Mode: "100644", Name: "x", ID: file})
	tree := r.mktree(treeEntry{Mode: "100644", Name: "Dockerfile", ID: df}, treeEntry{Mode: "120000", Name: "a", ID: link}, treeEntry{Mode: "40000", Name: "a", ID: inner})
	commit := g("", "commit-tree", tree, "-m", "crafted")
	req := r.request("duptree")
	req.Commit = commit
	_, out, err := build(t, b, req)
	if !errors.Is(err, builder.ErrUnsafeTree) || !strings.Contains(err.Error(), `holds "a" twice; rewrite the commit with git`) {
		t.Fatalf("err = %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 0 {
		t.Fatalf("the export wrote %d entries into the host directory", len(entries))
	}
	assertNoImage(t, bk, req)
}

func TestTheNumberOfFilesIsBounded(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.MaxContextFiles = 3 })
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n", "a": "a\n", "b": "b\n", "c": "c\n"})
	_, _, err := build(t, b, r.request("manyfiles"))
	if !errors.Is(err, builder.ErrContextTooLarge) || !strings.Contains(err.Error(), "has more than 3 files and directories, the limit of a build context") {
		t.Fatalf("err = %v", err)
	}
}

// TestAStepPastTheMemoryLimitFailsTheBuild runs a buildkitd of its own whose steps
// are limited to 64 MiB, as bex up's are to --build-memory.
func TestAStepPastTheMemoryLimitFailsTheBuild(t *testing.T) {
	const limit = 64 << 20
	testenv.SharedBusybox(t)
	bk, err := testenv.StartBuildkitd(t.TempDir(), testenv.SharedContainerd(t), testenv.WithBuildMemory(limit))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bk.Stop(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(bk.StepCgroup); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the build cgroup %s is left: %v", bk.StepCgroup, err)
		}
	})
	b, _ := newBuilder(t, func(c *builder.Config) {
		c.Address, c.StepMemory, c.StepCgroup = bk.Address, bk.StepMemory, bk.StepCgroup
	})
	t.Cleanup(func() { b.Close() })
	name := filepath.Base(bk.StepCgroup)

	// Under the limit: 16 MiB held at once; the step runs in the limited cgroup.
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n" +
		"RUN dd if=/dev/zero of=/dev/null bs=16M count=1 && grep memory /proc/self/cgroup\n"})
	_, out := mustBuild(t, b, r.request("undermem"))
	if !strings.Contains(out, "/"+name+"/buildkit/") {
		t.Fatalf("the step did not run under %s:\n%s", name, out)
	}

	// Past it: dd's 200 MiB buffer. The step is killed, and the build says why.
	r.commit(map[string]string{"Dockerfile": "FROM busybox\nRUN dd if=/dev/zero of=/dev/null bs=200M count=1\n"})
	_, out, err = build(t, b, r.request("overmem"))
	want := "build step ran out of memory (limit 64 MiB): [2/2] RUN dd if=/dev/zero of=/dev/null bs=200M count=1"
	if err == nil || err.Error() != want || !errors.Is(err, builder.ErrStepOutOfMemory) {
		t.Fatalf("err = %v, want %q\n%s", err, want, out)
	}
	if !strings.Contains(out, " !     "+want) {
		t.Fatalf("the build log lacks the reason:\n%s", out)
	}

	// A step killed with SIGKILL for another reason exits 137 too: it is not
	// reported as out of memory.
	r.commit(map[string]string{"Dockerfile": "FROM busybox\nRUN sh -c 'kill -9 $$'; exit $?\n"})
	_, out, err = build(t, b, r.request("killed"))
	if err == nil || errors.Is(err, builder.ErrStepOutOfMemory) || !strings.Contains(err.Error(), "failed with exit code 137") {
		t.Fatalf("err = %v\n%s", err, out)
	}

	// buildkitd lived through it and builds again.
	if err := b.Preflight(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.commit(map[string]string{"Dockerfile": "FROM busybox\nRUN echo after\n"})
	mustBuild(t, b, r.request("after"))
}

func TestThePlannerReadsNothingOutsideTheTree(t *testing.T) {
	b, _ := newBuilder(t)
	host := hostDir(t)
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"a plan", map[string]string{"index.html": "hi\n"}, "Procfile cannot be read because it is a link that leads outside the app"},
		{"an own Dockerfile", map[string]string{"Dockerfile": "FROM busybox\n"}, "Procfile cannot be read because it is a link that leads outside the app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t, tc.files)
			r.commitWithLinks(nil, map[string]string{"Procfile": filepath.Join(host, "marker")})
			_, out, err := build(t, b, r.request("planlink"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q\n%s", err, tc.want, out)
			}
			if strings.Contains(out, secret) || strings.Contains(err.Error(), secret) {
				t.Fatalf("the host's file reached the build:\n%s", out)
			}
		})
	}
}
