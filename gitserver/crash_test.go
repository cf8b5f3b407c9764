package gitserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/access"
	"bex.co/bex/gitserver/pipeline"
)

// The crash test runs the gitserver in a child process (this test binary, re-run
// with childEnv set), so that it can be killed with SIGKILL mid-push.
const childEnv = "BEX_TEST_GITSERVER_CHILD"

// runChildServer serves until killed. Its builder blocks forever after touching the
// marker file when BEX_TEST_BLOCK_BUILD is set.
func runChildServer() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child server:", err); return 1 }
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("BEX_TEST_KUBECONFIG"))
	if err != nil {
		return fail(err)
	}
	scheme := clientScheme()
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return fail(err)
	}
	w, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	dir, err := access.New(ctx, access.Config{Namespace: os.Getenv("BEX_TEST_NAMESPACE")}, c)
	if err != nil {
		return fail(err)
	}
	go func() { _ = c.Start(ctx) }()
	c.WaitForCacheSync(ctx)
	b := &fakeBuilder{}
	if marker := os.Getenv("BEX_TEST_BLOCK_BUILD"); marker != "" {
		b.hook = func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
			_ = os.WriteFile(marker, nil, 0o644)
			select {} // until SIGKILL
		}
	}
	scfg, pcfg := gitserver.DefaultConfig(), pipeline.DefaultConfig()
	scfg.StateDir, pcfg.StateDir = os.Getenv("BEX_TEST_STATE"), os.Getenv("BEX_TEST_STATE")
	scfg.Addr = os.Getenv("BEX_TEST_ADDR")
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pl, err := pipeline.New(pcfg, dir, b, &fakeReleaser{}, log, nil)
	if err != nil {
		return fail(err)
	}
	be, err := newBackend(w, c, os.Getenv("BEX_TEST_NAMESPACE"), log)
	if err != nil {
		return fail(err)
	}
	srv, err := gitserver.New(scfg, dir, be, pl, log, nil)
	if err != nil {
		return fail(err)
	}
	l, err := net.Listen("tcp", scfg.Addr)
	if err != nil {
		return fail(err)
	}
	return fail(srv.Serve(l))
}

func TestKilledServerLeavesTheRepositoryIntactAndTheRefUnmoved(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	state := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	marker := filepath.Join(t.TempDir(), "building")

	start := func(block bool) *exec.Cmd {
		t.Helper()
		if block {
			return startChildServer(t, e, state, addr, "BEX_TEST_BLOCK_BUILD="+marker)
		}
		return startChildServer(t, e, state, addr)
	}

	dir := admin.workdir("crash")
	admin.mustGit(dir, "remote", "set-url", "bex", "ssh://git@"+addr+"/crash")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	child := start(false)
	admin.mustGit(dir, "push", "bex", "main")
	_ = child.Process.Kill()
	_ = child.Wait()

	// Second push: the pack is stored, the build hangs, and the server is killed.
	child = start(true)
	second := admin.commit(dir, "app.txt", "killed mid-push\n")
	push := admin.gitCmd(dir, "push", "bex", "main")
	var pushOut strings.Builder
	push.Stdout, push.Stderr = &pushOut, &pushOut
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	e.eventually(func() error { _, err := os.Stat(marker); return err })
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if err := push.Wait(); err == nil {
		t.Fatalf("the push succeeded although the server died:\n%s", pushOut.String())
	}

	repo := filepath.Join(state, "repos", "crash.git")
	admin.mustGit(repo, "fsck", "--strict")
	if got := refAt(t, repo, "refs/heads/main"); got != first {
		t.Fatalf("main = %s after the crash, want the old %s", got, first)
	}

	// After a restart the same push goes through.
	start(false)
	admin.mustGit(dir, "push", "bex", "main")
	if got := refAt(t, repo, "refs/heads/main"); got != second {
		t.Fatalf("main = %s after the retried push, want %s", got, second)
	}
}

func refAt(t *testing.T, repo, ref string) string {
	t.Helper()
	out, err := exec.Command("git", "--git-dir", repo, "rev-parse", "--verify", "-q", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
