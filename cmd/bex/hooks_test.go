package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/webhook"
	"bex.co/bex/internal/testenv"
)

// hooksEnv is `bex gitserver --hooks-addr` run in process against the real control
// plane and buildkitd, with an admin whose key the ssh helper uses.
type hooksEnv struct {
	t                  *testing.T
	cp                 *testenv.ControlPlane
	bk                 *testenv.Buildkitd
	ns, state          string
	sshAddr, hooksAddr string
	admin              *testenv.SSHKey
	stderr             *testenv.SyncBuffer
}

func startHooksEnv(t *testing.T, ctx context.Context, extra ...string) *hooksEnv {
	t.Helper()
	e := &hooksEnv{t: t, cp: testenv.SharedControlPlane(t), bk: testenv.SharedBuildkitd(t), state: t.TempDir(), stderr: &testenv.SyncBuffer{}}
	testenv.SharedBusybox(t)
	e.ns = e.cp.Namespace(t, "hooks")
	e.admin = testenv.NewSSHKey(t)
	if err := e.cp.Client.Create(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "admin-" + e.ns}, Spec: appv1.UserSpec{
		Role: appv1.RoleAdmin, Keys: []appv1.SSHKey{{Name: "test", PublicKey: e.admin.AuthorizedKey}},
	}}); err != nil {
		t.Fatal(err)
	}
	ready, hooksReady := make(chan string, 1), make(chan string, 1)
	g := &gitserverCmd{errOut: e.stderr, log: slog.New(slog.NewTextHandler(e.stderr, nil)), ready: ready, hooksReady: hooksReady,
		registry: prometheus.NewRegistry()}
	cmd := wire(g)
	cmd.SetArgs(append([]string{"--state-dir", e.state, "--ssh-addr", "127.0.0.1:0", "--kubeconfig", e.cp.Kubeconfig,
		"--namespace", e.ns, "--buildkit-addr", e.bk.Address, "--image-resolve-mode", "local", "--hooks-addr", "127.0.0.1:0"}, extra...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	for e.sshAddr == "" || e.hooksAddr == "" {
		select {
		case e.sshAddr = <-ready:
		case e.hooksAddr = <-hooksReady:
		case err := <-done:
			t.Fatalf("bex gitserver: %v\n%s", err, e.stderr.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("bex gitserver did not start:\n%s", e.stderr.String())
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server:\n%s", e.stderr.String())
		}
	})
	return e
}

func (e *hooksEnv) ssh(args ...string) string {
	e.t.Helper()
	out, err := testenv.SSHCommand(e.admin, "bex", e.sshAddr, args...).Output()
	if err != nil {
		e.t.Fatalf("ssh %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (e *hooksEnv) release(app string, n int64) *appv1.Release {
	rel := &appv1.Release{}
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: fmt.Sprintf("%s-v%d", app, n)}, rel); err != nil {
		return nil
	}
	return rel
}

// logged checks that the server's log has a line containing s.
func (e *hooksEnv) logged(s string) func() error {
	return func() error {
		if !strings.Contains(e.stderr.String(), s) {
			return fmt.Errorf("no %q in the log", s)
		}
		return nil
	}
}

// refIs checks that app's ref is at commit.
func (e *hooksEnv) refIs(app, ref, commit string) func() error {
	return func() error {
		if got := e.ref(app, ref); got != commit {
			return fmt.Errorf("%s is at %q, want %s", ref, got, commit)
		}
		return nil
	}
}

func (e *hooksEnv) ref(app, ref string) string {
	out, _ := exec.Command("git", "--git-dir", filepath.Join(e.state, "repos", app+".git"), "rev-parse", "--verify", "-q", ref).Output()
	return strings.TrimSpace(string(out))
}

// upstreamApp makes a local upstream repository with one commit (a busybox image
// that prints msg) and an App following it over file://, and returns the upstream's
// directory and commit.
func (e *hooksEnv) upstreamApp(ctx context.Context, app, deployBranch, msg string) (string, string) {
	e.t.Helper()
	upstream := e.t.TempDir()
	gitIn(e.t, upstream, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(upstream, "Dockerfile"), []byte("FROM busybox\nCOPY msg /msg\nCMD [\"cat\", \"/msg\"]\n"), 0o644)
	head := commitMsg(e.t, upstream, msg)
	if err := e.cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: e.ns},
		Spec: appv1.AppSpec{Git: appv1.GitSpec{DeployBranch: deployBranch, Upstream: "file://" + upstream}}}); err != nil {
		e.t.Fatal(err)
	}
	return upstream, head
}

// gitIn runs git in dir as a test author.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	c := exec.Command("git", args...)
	c.Dir = dir
	c.Env = append(os.Environ(), "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func commitMsg(t *testing.T, dir, msg string) string {
	t.Helper()
	os.WriteFile(filepath.Join(dir, "msg"), []byte(msg), 0o644)
	gitIn(t, dir, "add", ".")
	gitIn(t, dir, "commit", "-q", "-m", msg)
	return gitIn(t, dir, "rev-parse", "HEAD")
}

// deliver posts a GitHub push delivery to the hook of app. Each delivery's body
// is its own, as GitHub's are (the same body with the same signature is a replay):
// it names the delivery, as a hook_id would.
func (e *hooksEnv) deliver(app, secret, delivery, after string) (int, webhook.Answer) {
	e.t.Helper()
	body := fmt.Sprintf(`{"ref":"refs/heads/main","before":"%040d","after":%q,"repository":{"full_name":"o/%s"},"test_delivery":%q}`, 0, after, app, delivery)
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.hooksAddr+"/hooks/"+app, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set("X-Hub-Signature-256", webhook.Sign([]byte(secret), []byte(body)))
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	if took := time.Since(start); took > time.Second {
		e.t.Errorf("delivery %s answered in %s", delivery, took)
	}
	var a webhook.Answer
	json.NewDecoder(res.Body).Decode(&a)
	return res.StatusCode, a
}

// TestWebhookFetchesBuildsAndDeploysTheUpstream: a local upstream gets commits; a
// signed GitHub push delivery makes bex fetch, build (real buildkitd) and release
// it, with the test playing the deployer; the branch follows once it serves.
// Deliveries during a deploy coalesce into one more, of the newest commit.
func TestWebhookFetchesBuildsAndDeploysTheUpstream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := startHooksEnv(t, ctx, "--allow-file-upstreams")

	upstream, head1 := e.upstreamApp(ctx, "mirror", "main", "v1")
	// The test plays the deployer; release 2 is held at its rollout until round two
	// has made its deliveries.
	deployer := testenv.StartFakeDeployer(ctx, t, e.cp.Client, e.ns)
	deployer.ServeUpTo(1)

	// No secret yet: no webhook at this URL.
	if code, _ := e.deliver("mirror", "anything", "x", head1); code != http.StatusNotFound {
		t.Fatalf("delivery before a secret: %d", code)
	}
	secret := strings.TrimSpace(e.ssh("webhooks:secret", "mirror"))
	if info := e.ssh("webhooks", "mirror"); !strings.Contains(info, "http://"+e.hooksAddr+"/hooks/mirror") || !strings.Contains(info, "Secret:        set") {
		t.Fatalf("webhooks mirror:\n%s", info)
	}
	if code, _ := e.deliver("mirror", "wrong", "x", head1); code != http.StatusUnauthorized {
		t.Fatalf("wrong signature: %d", code)
	}
	if !strings.Contains(e.stderr.String(), "remote=127.0.0.1:") {
		t.Fatalf("the rejection is not logged with its source:\n%s", e.stderr.String())
	}

	code, a := e.deliver("mirror", secret, "gh-1", head1)
	if code != http.StatusAccepted || a.Result != webhook.ResultQueued || a.Delivery != "gh-1" {
		t.Fatalf("first delivery: %d %+v", code, a)
	}
	testenv.Eventually(t, 90*time.Second, "main at the fetched commit", e.refIs("mirror", "refs/heads/main", head1))
	rel := e.release("mirror", 1)
	if rel == nil || rel.Spec.Cause != appv1.ReleaseCauseWebhook || rel.Spec.Delivery != "gh-1" || rel.Spec.Commit != head1 || rel.Spec.Actor != "webhook:github" {
		t.Fatalf("release 1: %+v", rel)
	}
	if out, code, err := e.bk.Containerd.Run(ctx, "bex.local/mirror:"+head1[:12]); err != nil || code != 0 || out != "v1" {
		t.Fatalf("running the built image: %q %d %v", out, code, err)
	}
	// The build log is stored like a push's.
	var builds []struct{ ID, Commit string }
	if err := json.Unmarshal([]byte(e.ssh("builds", "mirror", "--json")), &builds); err != nil || len(builds) != 1 || builds[0].Commit != head1 {
		t.Fatalf("builds: %v %+v", err, builds)
	}
	if log := e.ssh("builds:logs", "mirror"); !strings.Contains(log, "COPY msg /msg") {
		t.Fatalf("build log:\n%s", log)
	}

	// Round two: the deploy of head2 is held at its rollout; meanwhile head3 is
	// pushed upstream and announced twice, and gh-2 is delivered again.
	head2 := commitMsg(t, upstream, "v2")
	if code, a = e.deliver("mirror", secret, "gh-2", head2); a.Result != webhook.ResultQueued {
		t.Fatalf("gh-2: %d %+v", code, a)
	}
	testenv.Eventually(t, 90*time.Second, "release 2 recorded", func() error {
		if e.release("mirror", 2) == nil {
			return errors.New("no release 2")
		}
		return nil
	})
	head3 := commitMsg(t, upstream, "v3")
	for _, id := range []string{"gh-3", "gh-4"} {
		if code, a = e.deliver("mirror", secret, id, head3); code != http.StatusAccepted || a.Result != webhook.ResultCoalesced {
			t.Fatalf("%s during a deploy: %d %+v", id, code, a)
		}
	}
	if code, a = e.deliver("mirror", secret, "gh-2", head2); code != http.StatusOK || a.Result != webhook.ResultDuplicate {
		t.Fatalf("replayed gh-2: %d %+v", code, a)
	}
	deployer.ServeUpTo(0)
	testenv.Eventually(t, 90*time.Second, "main at the newest commit", e.refIs("mirror", "refs/heads/main", head3))
	if r := e.release("mirror", 2); r.Spec.Commit != head2 || r.Spec.Delivery != "gh-2" {
		t.Fatalf("release 2: %+v", r.Spec)
	}
	if r := e.release("mirror", 3); r == nil || r.Spec.Commit != head3 || r.Spec.Delivery != "gh-4" {
		t.Fatalf("release 3: %+v", r)
	}
	// Nothing more comes of the coalesced deliveries: once gh-4's redeploy has
	// ended, a new delivery finds no redeploy of the app running or waiting (it is
	// queued, not coalesced), so no fourth release of theirs is on its way.
	testenv.Eventually(t, 90*time.Second, "gh-4's redeploy ended", e.logged(`msg=redeployed webhook.app=mirror webhook.delivery=gh-4 `))
	if code, a = e.deliver("mirror", secret, "gh-5", head3); code != http.StatusAccepted || a.Result != webhook.ResultQueued {
		t.Fatalf("gh-5 after the coalesced redeploy: %d %+v (a redeploy still runs or waits)", code, a)
	}
	testenv.Eventually(t, 90*time.Second, "gh-5's redeploy ended", e.logged(`webhook.app=mirror webhook.delivery=gh-5 `))
	if r := e.release("mirror", 4); r == nil || r.Spec.Delivery != "gh-5" || e.release("mirror", 5) != nil {
		t.Fatalf("release 4 is not gh-5's, or a fifth came: the coalesced deliveries built twice: %+v", r)
	}
	// gh-1, gh-2, gh-4 (with gh-3) and gh-5: one build each.
	if err := json.Unmarshal([]byte(e.ssh("builds", "mirror", "--json")), &builds); err != nil || len(builds) != 4 {
		t.Fatalf("builds after the coalesced deliveries: %v %+v", err, builds)
	}
	if out, _, err := e.bk.Containerd.Run(ctx, "bex.local/mirror:"+head3[:12]); err != nil || out != "v3" {
		t.Fatalf("running the newest image: %q %v", out, err)
	}
	// Each redeploy is in the audit trail, by the way it came in, with its
	// delivery and release.
	var page backend.AuditPage
	if err := json.Unmarshal([]byte(e.ssh("audit", "mirror", "--json")), &page); err != nil {
		t.Fatal(err)
	}
	var deliveries []string
	for _, en := range page.Entries {
		if en.Via == backend.ViaWebhook {
			if en.User != "webhook:github" || en.Command != "webhook" || en.ReleaseAfter == 0 || en.Outcome != "ok" {
				t.Errorf("a webhook's entry: %+v", en)
			}
			deliveries = append(deliveries, fmt.Sprintf("%s v%d", en.Details["delivery"], en.ReleaseAfter))
		}
	}
	if strings.Join(deliveries, " ") != "gh-5 v4 gh-4 v3 gh-2 v2 gh-1 v1" {
		t.Errorf("the webhooks' entries: %v", deliveries)
	}
}
