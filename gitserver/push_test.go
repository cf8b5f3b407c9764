package gitserver_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/pipeline"
	"bex.co/bex/internal/testenv"
)

func TestFirstPushCreatesAppBuildsTheCommitAndMovesTheRef(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	head := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))

	out := admin.mustGit(dir, "push", "bex", "main")
	for _, want := range []string{
		"remote: -----> Creating app hello",
		"remote: -----> Building hello from main (" + head[:7] + ")",
		"remote: -----> [1/2] FROM scratch",
		"remote: -----> Deploying release v1",
		"remote: -----> Application deployed: release v1",
		"remote:        https://hello.bex.test",
		" * [new branch]      main -> main",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q:\n%s", want, out)
		}
	}
	builds := e.builder.all()
	if len(builds) != 1 || builds[0].Commit != head || builds[0].App != "hello" || builds[0].Branch != "main" {
		t.Fatalf("builds = %+v, want one of %s", builds, head)
	}
	rel := e.releaser.all()
	if len(rel) != 1 || rel[0].Commit != head || rel[0].Actor != admin.name || !strings.Contains(rel[0].Image, "@sha256:") {
		t.Fatalf("releases = %+v", rel)
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != head {
		t.Fatalf("main on the server = %q, want %s", got, head)
	}
	// The App exists, with the pusher as a member and main as its deploy branch.
	app, err := e.dir.App(context.Background(), "hello")
	if err != nil || app.DeployBranch != "main" || len(app.Members) != 1 || app.Members[0] != admin.name {
		t.Fatalf("app = %+v, %v", app, err)
	}
	ls := admin.mustGit(dir, "ls-remote", "bex")
	if !strings.Contains(ls, head+"\tHEAD") || !strings.Contains(ls, head+"\trefs/heads/main") {
		t.Fatalf("ls-remote:\n%s", ls)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	admin.mustGit(t.TempDir(), "clone", "-q", e.url("hello"), clone)
	if got := strings.TrimSpace(admin.mustGit(clone, "rev-parse", "HEAD")); got != head {
		t.Fatalf("clone HEAD = %s, want %s", got, head)
	}
	if data, _ := os.ReadFile(filepath.Join(clone, "app.txt")); string(data) != "hello\n" {
		t.Fatalf("clone app.txt = %q", data)
	}
}

func TestFailingBuildRejectsThePushAndKeepsTheRef(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "push", "bex", "main")

	e.builder.setHook(func(_ context.Context, _ pipeline.BuildRequest, progress io.Writer) error {
		fmt.Fprintf(progress, "       go: cannot find main module\n")
		return errors.New("step 2/2 RUN go build exited with code 1")
	})
	admin.commit(dir, "app.txt", "broken\n")
	out, err := admin.git(dir, "push", "bex", "main")
	if err == nil {
		t.Fatalf("push succeeded:\n%s", out)
	}
	for _, want := range []string{
		"remote:        go: cannot find main module",
		"remote:  !     Build failed: step 2/2 RUN go build exited with code 1",
		"! [remote rejected] main -> main (build failed)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q:\n%s", want, out)
		}
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main moved to %s after a failed build; want %s", got, first)
	}
	if n := len(e.releaser.all()); n != 1 {
		t.Fatalf("%d releases; a failed build must not release", n)
	}
}

func TestFailedRolloutRejectsThePush(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "push", "bex", "main")
	e.releaser.mu.Lock()
	e.releaser.fail = func(string, int64) error { return errors.New("web.1 never answered on PORT within 60s") }
	e.releaser.mu.Unlock()
	admin.commit(dir, "app.txt", "never healthy\n")
	out, err := admin.git(dir, "push", "bex", "main")
	if err == nil || !strings.Contains(out, "[remote rejected] main -> main (deploy failed)") ||
		!strings.Contains(out, "web.1 never answered on PORT within 60s") || !strings.Contains(out, "Release v1 keeps serving.") {
		t.Fatalf("want a rejection naming the rollout failure, got %v:\n%s", err, out)
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main moved after a failed rollout")
	}
}

func TestProgressReachesThePusherWhileTheBuildRuns(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	seen := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, progress io.Writer) error {
		fmt.Fprintf(progress, "       compiling, still running\n")
		// The build goes on only once the pusher has shown the line above.
		select {
		case <-seen:
			return nil
		case <-time.After(30 * time.Second):
			return errors.New("the progress line never reached the pusher")
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	cmd := admin.gitCmd(dir, "push", "--progress", "bex", "main")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	sc := bufio.NewScanner(stderr)
	sc.Split(scanLinesOrCR)
	for sc.Scan() {
		rest.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "compiling, still running") {
			close(seen)
			break
		}
	}
	_, _ = io.Copy(&rest, stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("push: %v\n%s", err, rest.String())
	}
	if !strings.Contains(rest.String(), "[2/2] COPY") {
		t.Fatalf("the build did not finish after its progress was seen:\n%s", rest.String())
	}
}

// scanLinesOrCR splits git's stderr on \n and on \r (progress meters).
func scanLinesOrCR(data []byte, atEOF bool) (int, []byte, error) {
	for i, b := range data {
		if b == '\n' || b == '\r' {
			return i + 1, data[:i], nil
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func TestAccessIsCheckedPerKeyAndApp(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	member := e.addUser("member", appv1.RoleMember, false)
	creator := e.addUser("creator", appv1.RoleMember, true)
	stranger := e.newKey("stranger")
	e.createApp("shared", member)
	e.createApp("private")

	admin.mustGit(admin.workdir("private"), "push", "bex", "main")
	member.mustGit(member.workdir("shared"), "push", "bex", "main")

	out, err := member.git(member.workdir("private"), "push", "bex", "main")
	if err == nil || !strings.Contains(out, "user "+member.name+" has no access to app private") {
		t.Fatalf("member pushing to an app without access: %v\n%s", err, out)
	}
	out, err = member.git(t.TempDir(), "clone", e.url("private"), filepath.Join(t.TempDir(), "c"))
	if err == nil || !strings.Contains(out, "has no access to app private") {
		t.Fatalf("member cloning an app without access: %v\n%s", err, out)
	}
	out, err = member.git(member.workdir("brand-new"), "push", "bex", "main")
	if err == nil || !strings.Contains(out, "app brand-new does not exist, and user "+member.name+" may not create apps") {
		t.Fatalf("member creating an app: %v\n%s", err, out)
	}
	creator.mustGit(creator.workdir("made-by-member"), "push", "bex", "main")
	out, err = stranger.git(stranger.workdir("shared"), "push", "bex", "main")
	if err == nil || !strings.Contains(out, "Permission denied (publickey)") {
		t.Fatalf("unknown key: %v\n%s", err, out)
	}
	if got := e.remoteRef("private", "refs/heads/main"); got == "" {
		t.Fatal("the admin's push did not land")
	}
}

func TestRepositoryPaths(t *testing.T) {
	for path, want := range map[string]string{
		"myapp": "myapp", "/myapp": "myapp", "myapp.git": "myapp", "/myapp.git": "myapp", "/myapp.git/": "myapp",
		"~/myapp.git": "myapp", "a": "a", strings.Repeat("a", 40): strings.Repeat("a", 40),
	} {
		if got, err := gitserver.AppFromPath(path); err != nil || got != want {
			t.Errorf("AppFromPath(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	for _, path := range []string{"", "/", "../etc", "/../../etc/passwd", "my/app", "MyApp", "-app", "app-", "my_app",
		strings.Repeat("a", 41), "my.app", ".git", "/repos/../x", "app\x00", "app name"} {
		if got, err := gitserver.AppFromPath(path); err == nil {
			t.Errorf("AppFromPath(%q) = %q, want an error", path, got)
		}
	}
}

func TestBadRepositoryPathIsRefusedWithAMessage(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("x")
	for _, path := range []string{"../../etc", "Not_An_App"} {
		out, err := admin.git(dir, "push", "ssh://git@"+e.addr+"/"+path, "main")
		if err == nil || !strings.Contains(out, "is not an app: an app name is 1 to 40 lower-case letters") {
			t.Errorf("push to %q: %v\n%s", path, err, out)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(e.state, "repos"))
	if len(entries) != 0 {
		t.Fatalf("repositories created by refused pushes: %v", entries)
	}
}

func TestBranchesTagsForcePushesDeletionsAndNoOps(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "push", "bex", "main")

	// Another branch is stored, not built.
	admin.mustGit(dir, "checkout", "-q", "-b", "feature")
	feature := admin.commit(dir, "feature.txt", "wip\n")
	out := admin.mustGit(dir, "push", "bex", "feature")
	if !strings.Contains(out, "Stored branch feature without deploying: only main deploys hello.") ||
		!strings.Contains(out, "To deploy it: git push bex feature:main") {
		t.Errorf("push of a feature branch:\n%s", out)
	}
	if got := e.remoteRef("hello", "refs/heads/feature"); got != feature {
		t.Errorf("feature = %q, want %s", got, feature)
	}
	if n := len(e.builder.all()); n != 1 {
		t.Errorf("%d builds after a feature-branch push, want 1", n)
	}

	// Tags are stored.
	admin.mustGit(dir, "tag", "v1", first)
	out = admin.mustGit(dir, "push", "bex", "v1")
	if !strings.Contains(out, "Stored tag v1.") || e.remoteRef("hello", "refs/tags/v1") != first {
		t.Errorf("tag push:\n%s", out)
	}

	// Deploying a branch by pushing it to main builds it.
	admin.mustGit(dir, "push", "bex", "feature:main")
	if got := e.remoteRef("hello", "refs/heads/main"); got != feature {
		t.Fatalf("main = %s after feature:main, want %s", got, feature)
	}

	// A force push of an older commit deploys it: rollback with git.
	out = admin.mustGit(dir, "push", "--force", "bex", first+":refs/heads/main")
	if !strings.Contains(out, "+ "+feature[:7]+"..."+first[:7]) || !strings.Contains(out, "forced update") {
		t.Errorf("force push:\n%s", out)
	}
	builds := e.builder.all()
	if last := builds[len(builds)-1]; last.Commit != first {
		t.Errorf("the force push built %s, want %s", last.Commit, first)
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main = %s after the force push, want %s", got, first)
	}

	// The deploy branch cannot be deleted; other branches can.
	out, err := admin.git(dir, "push", "bex", ":main")
	if err == nil || !strings.Contains(out, "[remote rejected] main (deleting the deploy branch is not allowed)") {
		t.Errorf("deleting main: %v\n%s", err, out)
	}
	if e.remoteRef("hello", "refs/heads/main") != first {
		t.Error("main was deleted")
	}
	admin.mustGit(dir, "push", "bex", ":feature")
	if got := e.remoteRef("hello", "refs/heads/feature"); got != "" {
		t.Errorf("feature still at %s after deletion", got)
	}

	// A push that changes nothing says so and builds nothing.
	before := len(e.builder.all())
	admin.mustGit(dir, "fetch", "-q", "bex")
	admin.mustGit(dir, "checkout", "-q", "-B", "main", "bex/main")
	out = admin.mustGit(dir, "push", "bex", "main")
	if !strings.Contains(out, "Everything up-to-date") || len(e.builder.all()) != before {
		t.Errorf("no-op push built or said:\n%s", out)
	}
}

func TestProtocolVersion2PushFallsBackAndWorks(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	head := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "-c", "protocol.version=2", "push", "bex", "main")
	if e.remoteRef("hello", "refs/heads/main") != head {
		t.Fatal("protocol v2 push did not land")
	}
	// Fetching speaks v2 for real through git's upload-pack.
	admin.mustGit(dir, "-c", "protocol.version=2", "fetch", "bex")
}

func TestPushOptions(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "-o", "no-cache", "-o", "colour=blue", "bex", "main")
	if b := e.builder.all(); len(b) != 1 || !b[0].NoCache {
		t.Fatalf("no-cache did not reach the builder: %+v", b)
	}

	// async: the ref moves at once, the build runs after the push returned.
	release := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		<-release
		return nil
	})
	next := admin.commit(dir, "app.txt", "async\n")
	out := admin.mustGit(dir, "push", "-o", "async", "bex", "main")
	if !strings.Contains(out, "in the background (push option async)") {
		t.Fatalf("async push output:\n%s", out)
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != next {
		t.Fatalf("async push: main = %s, want %s at once", got, next)
	}
	if n := len(e.releaser.all()); n != 1 {
		t.Fatalf("async: %d releases before the build finished", n)
	}
	close(release)
	e.eventually(func() error {
		if n := len(e.releaser.all()); n != 2 {
			return fmt.Errorf("%d releases", n)
		}
		return nil
	})
}

func TestTwoPushesToOneAppTakeTurns(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "bex", "main")

	// The first push holds the build until the second one is waiting.
	started := make(chan struct{}, 2)
	proceed := make(chan struct{})
	var calls int
	var mu sync.Mutex
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		started <- struct{}{}
		if first {
			<-proceed
		}
		return nil
	})
	other := admin.workdir("hello")
	admin.mustGit(other, "fetch", "-q", "bex")
	admin.mustGit(other, "checkout", "-q", "-b", "feature", "bex/main")
	admin.commit(other, "other.txt", "other\n")

	admin.commit(dir, "app.txt", "first\n")
	firstPush := admin.gitCmd(dir, "push", "bex", "main")
	var firstOut strings.Builder
	firstPush.Stdout, firstPush.Stderr = &firstOut, &firstOut
	if err := firstPush.Start(); err != nil {
		t.Fatal(err)
	}
	<-started
	// The second push (another branch, force-deployed to main) waits for the first.
	secondPush := admin.gitCmd(other, "push", "--force", "bex", "feature:main")
	secondOut := &testenv.SyncBuffer{}
	secondPush.Stdout, secondPush.Stderr = secondOut, secondOut
	if err := secondPush.Start(); err != nil {
		t.Fatal(err)
	}
	e.eventually(func() error {
		if !strings.Contains(secondOut.String(), "Waiting for the deploy of") {
			return fmt.Errorf("second push output so far: %q", secondOut.String())
		}
		return nil
	})
	close(proceed)
	if err := firstPush.Wait(); err != nil {
		t.Fatalf("first push: %v\n%s", err, firstOut.String())
	}
	if err := secondPush.Wait(); err != nil {
		t.Fatalf("second push: %v\n%s", err, secondOut.String())
	}
	if n := len(e.releaser.all()); n != 3 {
		t.Fatalf("%d releases, want 3", n)
	}
}

func TestPushesToTwoAppsBuildAtTheSameTime(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	both := make(chan struct{})
	var mu sync.Mutex
	running := 0
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		mu.Lock()
		running++
		if running == 2 {
			close(both)
		}
		mu.Unlock()
		select {
		case <-both:
			return nil
		case <-time.After(30 * time.Second):
			return errors.New("the other app's build never ran beside this one")
		}
	})
	var wg sync.WaitGroup
	for _, app := range []string{"one", "two"} {
		dir := admin.workdir(app)
		wg.Go(func() {
			if out, err := admin.git(dir, "push", "bex", "main"); err != nil {
				t.Errorf("push %s: %v\n%s", app, err, out)
			}
		})
	}
	wg.Wait()
}

func TestPusherLeavingMidBuildCancelsIt(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))
	admin.mustGit(dir, "push", "bex", "main")

	inBuild := make(chan struct{})
	cancelled := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		close(inBuild)
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	})
	admin.commit(dir, "app.txt", "abandoned\n")
	push := admin.gitCmd(dir, "push", "bex", "main")
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	<-inBuild
	// Kill git and its ssh: the connection drops.
	_ = push.Process.Kill()
	_ = push.Wait()
	killSSHChildren(t, admin.keyPath)
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the build was not cancelled when the pusher left")
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main = %s after an abandoned push, want %s", got, first)
	}
	// The app's lock was freed: the next push goes through.
	e.builder.setHook(nil)
	admin.mustGit(dir, "push", "bex", "main")
}

// killSSHChildren ends the ssh processes the test's git started with keyPath: killing
// git leaves its ssh child running.
func killSSHChildren(t *testing.T, keyPath string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmdline), "ssh\x00") || !strings.Contains(string(cmdline), keyPath) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err == nil {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
}

// TestRemovedAccessEndsAPushWaitingForTheLock: a member's push that waits for the
// app's lock ends, within 2 s and with one line saying why, when the member's
// access is taken away meanwhile (at the default recheck interval); the push that
// holds the lock, an admin's, goes on and lands.
func TestRemovedAccessEndsAPushWaitingForTheLock(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	bob := e.addUser("bob", appv1.RoleMember, false)
	e.createApp("hello", bob)
	dir := admin.workdir("hello")
	admin.mustGit(dir, "push", "bex", "main")

	// The admin's push holds the build (and the lock) until told to go on.
	started := make(chan struct{}, 1)
	proceed := make(chan struct{})
	e.builder.setHook(func(ctx context.Context, _ pipeline.BuildRequest, _ io.Writer) error {
		started <- struct{}{}
		<-proceed
		return nil
	})
	admin.commit(dir, "app.txt", "first\n")
	firstPush := admin.gitCmd(dir, "push", "bex", "main")
	firstOut := &testenv.SyncBuffer{}
	firstPush.Stdout, firstPush.Stderr = firstOut, firstOut
	if err := firstPush.Start(); err != nil {
		t.Fatal(err)
	}
	<-started

	other := bob.workdir("hello")
	bob.mustGit(other, "fetch", "-q", "bex")
	bob.mustGit(other, "checkout", "-q", "-b", "feature", "bex/main")
	bob.commit(other, "other.txt", "other\n")
	bobPush := bob.gitCmd(other, "push", "bex", "feature")
	bobOut := &testenv.SyncBuffer{}
	bobPush.Stdout, bobPush.Stderr = bobOut, bobOut
	if err := bobPush.Start(); err != nil {
		t.Fatal(err)
	}
	bobDone := make(chan error, 1)
	go func() { bobDone <- bobPush.Wait() }()
	e.eventually(func() error {
		if !strings.Contains(bobOut.String(), "Waiting for the deploy of") {
			return fmt.Errorf("bob's push output so far: %q", bobOut.String())
		}
		return nil
	})

	// access:remove hello bob, as the backend writes it.
	app := &appv1.App{}
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "hello"}, app); err != nil {
		t.Fatal(err)
	}
	app.Spec.Members = nil
	if err := e.cp.Client.Update(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	select {
	case err := <-bobDone:
		want := "bex: your access to hello was removed: this session ends\n"
		if err == nil || strings.Count(bobOut.String(), want) != 1 {
			t.Fatalf("bob's push ended with %v:\n%s", err, bobOut.String())
		}
		t.Logf("bob's waiting push ended %v after his access was removed", time.Since(removed).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		t.Fatalf("bob's push still waits 2s after his access was removed:\n%s", bobOut.String())
	}
	if got := e.remoteRef("hello", "refs/heads/feature"); got != "" {
		t.Fatalf("bob's branch landed: %s", got)
	}
	// The control: the admin's push, which held the lock, lands.
	close(proceed)
	if err := firstPush.Wait(); err != nil {
		t.Fatalf("the admin's push: %v\n%s", err, firstOut.String())
	}
}

// Each of Dokku's deployment tasks that fails rejects the push naming its phase,
// the ref where it was and what serves said; a first deploy that fails says
// that nothing serves.
func TestFailingDeploymentTasksRejectThePushNamingTheirPhase(t *testing.T) {
	e := newEnv(t)
	admin := e.addUser("admin", appv1.RoleAdmin, false)
	dir := admin.workdir("hello")
	first := strings.TrimSpace(admin.mustGit(dir, "rev-parse", "HEAD"))

	// The first push: its build fails, and nothing served before it.
	e.builder.setHook(func(context.Context, pipeline.BuildRequest, io.Writer) error {
		return errors.New("step 2/2 RUN make exited with code 2")
	})
	out, err := admin.git(dir, "push", "bex", "main")
	if err == nil || !strings.Contains(out, "Nothing changed on hello: nothing serves: no release of hello has served yet.") {
		t.Fatalf("a first push that fails: %v\n%s", err, out)
	}
	e.builder.setHook(nil)
	admin.mustGit(dir, "push", "bex", "main")

	e.builder.setHook(func(_ context.Context, _ pipeline.BuildRequest, progress io.Writer) error {
		fmt.Fprintf(progress, "       no database\n")
		return fmt.Errorf("%w: predeploy (app.json scripts.dokku.predeploy) exited with status 3", pipeline.ErrPredeployFailed)
	})
	admin.commit(dir, "app.txt", "predeploy fails\n")
	out, err = admin.git(dir, "push", "bex", "main")
	for _, want := range []string{"remote:        no database", "predeploy (app.json scripts.dokku.predeploy) exited with status 3",
		"Nothing changed on hello: release v1 keeps serving.", "! [remote rejected] main -> main (predeploy failed)"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("a failing predeploy: output lacks %q (%v):\n%s", want, err, out)
		}
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main moved after a failing predeploy")
	}

	e.builder.setHook(nil)
	e.releaser.mu.Lock()
	e.releaser.fail = func(_ string, n int64) error {
		return fmt.Errorf("%w: release v%d failed: postdeploy (app.json scripts.dokku.postdeploy) exited with status 4", pipeline.ErrPostdeployFailed, n)
	}
	e.releaser.mu.Unlock()
	out, err = admin.git(dir, "push", "bex", "main")
	for _, want := range []string{"release v2 failed: postdeploy (app.json scripts.dokku.postdeploy) exited with status 4",
		"Release v1 keeps serving.", "! [remote rejected] main -> main (postdeploy failed)"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("a failing postdeploy: output lacks %q (%v):\n%s", want, err, out)
		}
	}
	if got := e.remoteRef("hello", "refs/heads/main"); got != first {
		t.Fatalf("main moved after a failing postdeploy")
	}
}
