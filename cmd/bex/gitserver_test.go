package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestGitserverBuildsAPushAndRecordsItsRelease runs `bex gitserver` in process
// against the real control plane and the real buildkitd, pushes a busybox app with the
// real git and ssh, and plays the deployer's part (envtest runs no controller): it
// marks the recorded release as serving, after which the push completes.
func TestGitserverBuildsAPushAndRecordsItsRelease(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := cp.Namespace(t, "gitserver-e2e")
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := gossh.NewSignerFromKey(priv)
	block, _ := gossh.MarshalPrivateKey(priv, "")
	keyPath := filepath.Join(t.TempDir(), "id_ed25519")
	os.WriteFile(keyPath, pem.EncodeToMemory(block), 0o600)
	if err := cp.Client.Create(ctx, &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: "e2e-admin"}, Spec: appv1.UserSpec{
		Role: appv1.RoleAdmin, Keys: []appv1.SSHKey{{Name: "test", PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey())))}},
	}}); err != nil {
		t.Fatal(err)
	}

	ready := make(chan string, 1)
	var stderr bytes.Buffer
	g := &gitserverCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil)), ready: ready}
	cmd := wire(g)
	state := t.TempDir()
	cmd.SetArgs([]string{"--state-dir", state, "--ssh-addr", "127.0.0.1:0", "--kubeconfig", cp.Kubeconfig,
		"--namespace", ns, "--buildkit-addr", bk.Address, "--image-resolve-mode", "local"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("bex gitserver: %v\n%s", err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("bex gitserver did not start:\n%s", stderr.String())
	}

	// The deployer's part: each recorded release is reported serving.
	testenv.StartFakeDeployer(ctx, t, cp.Client, ns)

	work := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		c := exec.Command("git", args...)
		c.Dir = work
		c.Env = append(os.Environ(), "HOME="+work, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co",
			"GIT_SSH_COMMAND=ssh -F /dev/null -i "+keyPath+" -o IdentitiesOnly=yes -o IdentityAgent=none -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR -o BatchMode=yes")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s\nserver:\n%s", args, err, out, stderr.String())
		}
		return string(out)
	}
	git("init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(work, "Dockerfile"), []byte("FROM busybox\nRUN echo built > /built\nCMD [\"cat\", \"/built\"]\n"), 0o644)
	// A second push builds with the App's build settings: another directory, a
	// target and an argument.
	os.MkdirAll(filepath.Join(work, "web"), 0o755)
	os.WriteFile(filepath.Join(work, "web", "Dockerfile"), []byte("FROM busybox AS base\nARG WORD=unset\nRUN echo \"$WORD\" > /built\n"+
		"FROM base AS other\nRUN echo wrong > /built\nFROM base AS chosen\nCMD [\"cat\", \"/built\"]\nFROM other\n"), 0o644)
	git("add", ".")
	git("commit", "-q", "-m", "first")
	head := strings.TrimSpace(git("rev-parse", "HEAD"))
	out := git("push", "ssh://git@"+addr+"/hello", "main")
	for _, want := range []string{"-----> Creating app hello", "-----> [2/2] RUN echo built > /built", "-----> Built bex.local/hello@sha256:",
		"-----> Deploying release v1", "https://hello.localhost", "* [new branch]      main -> main"} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q:\n%s", want, out)
		}
	}
	rel := &appv1.Release{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hello-v1"}, rel); err != nil {
		t.Fatal(err)
	}
	if rel.Spec.Commit != head || !strings.HasPrefix(rel.Spec.Image, "bex.local/hello@sha256:") || rel.Spec.Actor != "e2e-admin" || rel.Spec.Cause != appv1.ReleaseCausePush {
		t.Fatalf("release %+v", rel.Spec)
	}
	// The image is in containerd, where the local runtime will find it.
	runOut, code, err := bk.Containerd.Run(ctx, "bex.local/hello:"+head[:12])
	if err != nil || code != 0 || runOut != "built" {
		t.Fatalf("running the built image: %q %d %v", runOut, code, err)
	}

	app := &appv1.App{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hello"}, app); err != nil {
		t.Fatal(err)
	}
	app.Spec.Build = appv1.BuildSpec{Dir: "web", Target: "chosen", Args: []appv1.BuildArg{{Name: "WORD", Value: "from the app's settings"}}}
	if err := cp.Client.Update(ctx, app); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(work, "web", "touch"), []byte("1"), 0o644)
	git("add", ".")
	git("commit", "-q", "-m", "second")
	head = strings.TrimSpace(git("rev-parse", "HEAD"))
	git("push", "ssh://git@"+addr+"/hello", "main")
	runOut, code, err = bk.Containerd.Run(ctx, "bex.local/hello:"+head[:12])
	if err != nil || code != 0 || runOut != "from the app's settings" {
		t.Fatalf("the second build ignored the App's build settings: %q %d %v", runOut, code, err)
	}

	// The ssh commands are wired: build logs from the builder, runtime logs from
	// the local runtime's files in the shared state directory, the repository
	// removed with the app.
	sshCmd := func(args ...string) string {
		t.Helper()
		c := testenv.SSHCommand(&testenv.SSHKey{Path: keyPath}, "bex", addr, args...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("ssh %v: %v\n%s\nserver:\n%s", args, err, out, stderr.String())
		}
		return string(out)
	}
	var builds []struct{ ID, Commit string }
	if err := json.Unmarshal([]byte(sshCmd("builds", "hello", "--json")), &builds); err != nil || len(builds) != 2 || builds[0].Commit != head {
		t.Fatalf("builds --json: %v %+v", err, builds)
	}
	if out := sshCmd("builds:logs", "hello", builds[1].ID); !strings.Contains(out, "RUN echo built > /built") {
		t.Fatalf("builds:logs of the first build:\n%s", out)
	}
	logDir := filepath.Join(state, "runtime", "logs", ns, "hello")
	os.MkdirAll(logDir, 0o700)
	os.WriteFile(filepath.Join(logDir, "web.1-r2-abcdef.log"), []byte("listening\n"), 0o600)
	if out := sshCmd("logs", "hello"); out != "web.1[r2]: listening\n" {
		t.Fatalf("logs: %q", out)
	}
	if _, err := os.Stat(filepath.Join(state, "repos", "hello.git")); err != nil {
		t.Fatal(err)
	}
	// The app has a deploy key of its own, kept as a Secret, never the host key;
	// the upstream checks are wired (this gitserver allows no private upstreams).
	var hook struct{ DeployKey string }
	if err := json.Unmarshal([]byte(sshCmd("webhooks", "hello", "--json")), &hook); err != nil {
		t.Fatal(err)
	}
	hostPEM, err := os.ReadFile(filepath.Join(state, "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := gossh.ParsePrivateKey(hostPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hook.DeployKey, "ssh-ed25519 ") || hook.DeployKey == strings.TrimSpace(string(gossh.MarshalAuthorizedKey(hostKey.PublicKey()))) {
		t.Fatalf("the deploy key %q is not the app's own", hook.DeployKey)
	}
	if rotated := strings.TrimSpace(sshCmd("webhooks:deploy-key", "hello", "--rotate")); !strings.Contains(rotated, "ssh-ed25519 ") || strings.Contains(rotated, hook.DeployKey) {
		t.Fatalf("webhooks:deploy-key --rotate: %q", rotated)
	}
	refused, err := testenv.SSHCommand(&testenv.SSHKey{Path: keyPath}, "bex", addr, "webhooks:upstream", "hello", cp.Config.Host+"/x.git").CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "is a loopback address") {
		t.Fatalf("an upstream at the API server (%s): %v %s", cp.Config.Host, err, refused)
	}
	sshCmd("apps:destroy", "hello", "--confirm", "hello")
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hello-deploy-key"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the deploy key after apps:destroy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "repos", "hello.git")); !os.IsNotExist(err) {
		t.Fatalf("the repository is still there after apps:destroy: %v", err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("bex gitserver ended with %v", err)
	}
}

func TestUsersAddMakesTheFirstAdmin(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	admin, member := testenv.NewSSHKey(t), testenv.NewSSHKey(t)
	pub := func(k *testenv.SSHKey) string {
		p := filepath.Join(t.TempDir(), "key.pub")
		os.WriteFile(p, []byte(k.AuthorizedKey+"\n"), 0o644)
		return p
	}
	api := []string{"--kubeconfig", cp.Kubeconfig}
	out, err := runBex(t, append([]string{"users", "add", "first-admin", "--admin", "--key", pub(admin)}, api...)...)
	if err != nil || !strings.Contains(out, "first-admin is an admin") {
		t.Fatalf("users add --admin: %v\n%s", err, out)
	}
	if out, err := runBex(t, append([]string{"users", "add", "first-admin", "--admin", "--key", pub(admin)}, api...)...); err != nil || !strings.Contains(out, "already") {
		t.Fatalf("users add --admin again: %v\n%s", err, out)
	}
	if out, err := runBex(t, append([]string{"users", "add", "first-member", "--key", pub(member)}, api...)...); err != nil || !strings.Contains(out, "Created member first-member") {
		t.Fatalf("users add member: %v\n%s", err, out)
	}
	if out, err := runBex(t, append([]string{"users", "add", "second", "--key", pub(member)}, api...)...); err == nil || !strings.Contains(err.Error(), "belongs to another user") {
		t.Fatalf("a key held twice: %v\n%s", err, out)
	}
	out, err = runBex(t, append([]string{"users", "list", "--json"}, api...)...)
	var users []struct {
		Name, Role string
		Keys       int
	}
	if err != nil || json.Unmarshal([]byte(out), &users) != nil {
		t.Fatalf("users list --json: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, u := range users {
		got[u.Name] = fmt.Sprintf("%s/%d", u.Role, u.Keys)
	}
	if got["first-admin"] != "admin/1" || got["first-member"] != "member/1" {
		t.Fatalf("users list: %v", got)
	}
}
