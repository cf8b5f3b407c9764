package gitserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

// upstream is a repository on disk standing in for the app's code on another host.
func (u *user) upstream() (dir, url string) {
	u.env.t.Helper()
	dir = u.env.t.TempDir()
	u.mustGit(dir, "init", "-q", "-b", "main")
	u.commit(dir, "app.txt", "v1\n")
	return dir, "file://" + dir
}

func allowFile(c *config) { c.AllowFileUpstreams = true }

// TestDeployFetchesTheUpstream: a deploy of an app with an upstream fetches its
// deploy branch, builds and releases the fetched commit (cause and delivery
// recorded), and moves the branch only once the release serves.
func TestDeployFetchesTheUpstream(t *testing.T) {
	e := newEnv(t, allowFile)
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("mirror")
	dir, url := ana.upstream()
	first := strings.TrimSpace(ana.mustGit(dir, "rev-parse", "HEAD"))

	var progress bytes.Buffer
	res, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{
		App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook, Actor: "webhook:github", Delivery: "d-1",
	}, &progress)
	if err != nil {
		t.Fatalf("Deploy: %v\n%s", err, progress.String())
	}
	if res.Commit != first || res.Release != 1 || res.URL != "https://mirror.bex.test" {
		t.Fatalf("result %+v, want commit %s", res, first)
	}
	for _, want := range []string{"-----> Fetching main from file://", "-----> Building mirror from main (" + first[:7] + ")", "-----> Application deployed: release v1"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	if got := e.remoteRef("mirror", "refs/heads/main"); got != first {
		t.Fatalf("main is %q after the deploy, want %s", got, first)
	}
	rels := e.releaser.all()
	if len(rels) != 1 || rels[0].Cause != pipeline.CauseWebhook || rels[0].Delivery != "d-1" || rels[0].Commit != first || rels[0].Actor != "webhook:github" {
		t.Fatalf("releases %+v", rels)
	}
	// A clone of the app gets what runs, and not the fetch's own ref.
	clone := t.TempDir()
	ana.mustGit(clone, "clone", "-q", e.url("mirror"), ".")
	if head := strings.TrimSpace(ana.mustGit(clone, "rev-parse", "HEAD")); head != first {
		t.Fatalf("clone at %s", head)
	}
	if refs := ana.mustGit(clone, "ls-remote", "origin"); strings.Contains(refs, "refs/bex/") {
		t.Fatalf("the fetch's ref is advertised:\n%s", refs)
	}

	// A new commit upstream: fetched, built, and main follows.
	second := ana.commit(dir, "app.txt", "v2\n")
	if res, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook, Actor: "webhook:github", Delivery: "d-2"}, nil); err != nil || res.Commit != second {
		t.Fatalf("second deploy: %+v %v", res, err)
	}
	if got := e.remoteRef("mirror", "refs/heads/main"); got != second {
		t.Fatalf("main is %q, want %s", got, second)
	}

	// A rollout that fails leaves main where it was.
	third := ana.commit(dir, "app.txt", "v3\n")
	e.releaser.mu.Lock()
	e.releaser.fail = func(string, int64) error { return errors.New("web.1 crashed") }
	e.releaser.mu.Unlock()
	_, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook, Actor: "webhook:github"}, nil)
	if !errors.Is(err, pipeline.ErrDeployFailed) || !strings.Contains(err.Error(), "web.1 crashed") {
		t.Fatalf("failed rollout: %v", err)
	}
	if got := e.remoteRef("mirror", "refs/heads/main"); got != second {
		t.Fatalf("main moved to %q after a failed rollout, want %s (third %s)", got, second, third)
	}
	if b := e.builder.all(); len(b) != 3 || b[2].Commit != third {
		t.Fatalf("builds %+v", b)
	}

	// An upstream without the branch, and one that does not exist.
	_, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: "file:///nonexistent/repo.git", Cause: pipeline.CauseWebhook}, nil)
	if !errors.Is(err, pipeline.ErrDeployFailed) {
		t.Fatalf("missing upstream: %v", err)
	}
}

func TestDeployRefusesFileUpstreamsUnlessAllowed(t *testing.T) {
	e := newEnv(t)
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("mirror")
	_, url := ana.upstream()
	_, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook}, nil)
	if err == nil || !strings.Contains(err.Error(), "--allow-file-upstreams") {
		t.Fatalf("file:// upstream without the flag: %v", err)
	}
	for _, u := range []string{"http://example.com/x.git", "ftp://example.com/x"} {
		if _, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: u}, nil); err == nil {
			t.Fatalf("upstream %s accepted", u)
		}
	}
	if len(e.builder.all()) != 0 {
		t.Fatal("built from a refused upstream")
	}
}

// TestDeployRebuildsWithoutUpstream: without an upstream a deploy rebuilds the
// deploy branch's commit, or a commit given; the branch does not move.
func TestDeployRebuildsWithoutUpstream(t *testing.T) {
	e := newEnv(t)
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	_, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "nothing"}, nil)
	if !errors.Is(err, pipeline.ErrAppNotFound) {
		t.Fatalf("unknown app: %v", err)
	}
	e.createApp("empty")
	if _, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "empty"}, nil); !errors.Is(err, pipeline.ErrNothingToDeploy) {
		t.Fatalf("app without code: %v", err)
	}

	dir := ana.workdir("shop")
	first := strings.TrimSpace(ana.mustGit(dir, "rev-parse", "HEAD"))
	ana.mustGit(dir, "push", "-q", "bex", "main")
	second := ana.commit(dir, "app.txt", "two\n")
	ana.mustGit(dir, "push", "-q", "bex", "main")

	res, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "shop", Cause: pipeline.CauseDeploy, Actor: ana.name}, nil)
	if err != nil || res.Commit != second || res.Release != 3 {
		t.Fatalf("rebuild: %+v %v", res, err)
	}
	res, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "shop", Commit: first, Cause: pipeline.CauseDeploy, Actor: ana.name}, nil)
	if err != nil || res.Commit != first {
		t.Fatalf("deploy of a given commit: %+v %v", res, err)
	}
	if got := e.remoteRef("shop", "refs/heads/main"); got != second {
		t.Fatalf("main moved to %s on a deploy of a given commit", got)
	}
	for _, c := range []string{"deadbeef", strings.Repeat("a", 40), "../" + first[3:]} {
		if _, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "shop", Commit: c}, nil); !errors.Is(err, pipeline.ErrNothingToDeploy) {
			t.Fatalf("commit %q: %v", c, err)
		}
	}
	rels := e.releaser.all()
	if len(rels) != 4 || rels[2].Cause != pipeline.CauseDeploy || rels[0].Cause != pipeline.CausePush {
		t.Fatalf("releases %+v", rels)
	}
}

// TestDeployAndPushShareTheLock: a push that arrives during a deploy waits for it,
// saying so, and then builds.
func TestDeployAndPushShareTheLock(t *testing.T) {
	e := newEnv(t)
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	dir := ana.workdir("shop")
	ana.mustGit(dir, "push", "-q", "bex", "main")
	started, release := make(chan struct{}), make(chan struct{})
	e.builder.setHook(func(ctx context.Context, req pipeline.BuildRequest, _ io.Writer) error {
		if len(e.builder.all()) == 2 { // the deploy's build
			close(started)
			<-release
		}
		return nil
	})
	deployed := make(chan error, 1)
	go func() {
		_, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "shop", Cause: pipeline.CauseWebhook, Actor: "webhook:gitlab"}, nil)
		deployed <- err
	}()
	<-started
	ana.commit(dir, "app.txt", "during the deploy\n")
	push := ana.gitCmd(dir, "push", "bex", "main")
	var out testenv.SyncBuffer // read while git writes it
	push.Stdout, push.Stderr = &out, &out
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	e.eventually(func() error {
		if !strings.Contains(out.String(), "Waiting for") {
			return fmt.Errorf("push output so far: %q", out.String())
		}
		return nil
	})
	if !strings.Contains(out.String(), "by webhook:gitlab to finish") {
		t.Fatalf("the push does not say what it waits for:\n%s", out.String())
	}
	if n := len(e.builder.all()); n != 2 {
		t.Fatalf("%d builds while the deploy holds the lock", n)
	}
	close(release)
	if err := <-deployed; err != nil {
		t.Fatal(err)
	}
	if err := push.Wait(); err != nil {
		t.Fatalf("push after the deploy: %v\n%s", err, out.String())
	}
	if n := len(e.builder.all()); n != 3 {
		t.Fatalf("%d builds, want 3", n)
	}
}

// TestDeployRefusesAnUpstreamThatGitFsckWouldRefuse: a fetched upstream gets the
// checks of a push: a tree with a symlink and a directory of one name, or a file
// over the object limit, is refused with its line, and nothing is built.
func TestDeployRefusesAnUpstreamThatGitFsckWouldRefuse(t *testing.T) {
	e := newEnv(t, allowFile, func(c *config) { c.MaxObjectBytes = 1 << 20 })
	ana := e.addUser("ana", appv1.RoleAdmin, true)
	e.createApp("mirror")
	dir, url := ana.upstream()

	file := hashObject(t, dir, "blob", []byte("x\n"))
	sub := hashObject(t, dir, "tree", rawTree(t, [3]string{"100644", "x", file}))
	tree := hashObject(t, dir, "tree", rawTree(t, [3]string{"120000", "a", hashObject(t, dir, "blob", []byte("/etc/cron.d"))}, [3]string{"40000", "a", sub}))
	craftedCommit(t, ana, dir, tree)
	_, err := e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook}, nil)
	if want := "object " + tree[:7] + ": duplicateEntries: contains duplicate file entries"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want %q, got %v", want, err)
	}

	ana.mustGit(dir, "reset", "-q", "--hard", "main~1")
	ana.commit(dir, "big.bin", strings.Repeat("0123456789abcdef", 1<<17)) // 2 MiB
	_, err = e.pl.Deploy(context.Background(), pipeline.DeployRequest{App: "mirror", Upstream: url, Cause: pipeline.CauseWebhook}, nil)
	if want := "big.bin is 2.0 MiB, more than the limit of 1.0 MiB per file"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want %q, got %v", want, err)
	}
	if b := e.builder.all(); len(b) != 0 {
		t.Fatalf("builds %+v", b)
	}
	if got := e.remoteRef("mirror", "refs/heads/main"); got != "" {
		t.Fatalf("main is %s", got)
	}
}
