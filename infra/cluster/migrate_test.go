package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestMigrate moves an app from one machine to the cluster as docs/cluster.md's
// "4. Moving the apps" says, by running that section's shell blocks as they are
// written: a real `bex up` gets a push of hello-shell, a second user with access to
// the app, a config var, a config var from a Secret (an App edit with kubectl, which
// records a release too) and a webhook secret; the blocks export its Users, Apps,
// Releases and Secrets with the real kubectl and jq, apply them to the cluster and
// give the Releases their App as owner again. Then the same repository is pushed to
// the cluster's gitserver by the second user (whose key came along): it serves over
// HTTPS with its config var, its release is the next after the migrated ones, and the
// App's members, config (its Secret too) and webhook secret survived; apps:destroy
// then deletes the moved Releases (their owner is the cluster's App).
func TestMigrate(t *testing.T) {
	const app = "moved"
	adminKey := newKey(t, "one-machine-admin@bex")
	devKey := newKey(t, "dev@bex")
	m := startOneMachine(t, adminKey)

	// On the one machine: a push, a user with access, a config var, a webhook secret.
	r := repoWithKey(t, "hello-shell", adminKey)
	r.git(t, "remote", "add", "bex", m.remote(app))
	if out, err := r.push(); err != nil {
		t.Fatalf("push to bex up: %v\n%s", err, out)
	}
	devPub, err := os.ReadFile(devKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"users:add", "dev"}, {"access:add", app, "dev"}, {"config:set", app, "GREETING=moved"}, {"webhooks:secret", app}} {
		if out, err := m.ssh(adminKey, c...); err != nil {
			t.Fatalf("bex up: %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	addKey := exec.Command(strings.Fields(sshCommandWith(adminKey))[0], append(strings.Fields(sshCommandWith(adminKey))[1:], "-p", portOf(m.sshAddr), "git@127.0.0.1", "keys:add", "laptop", "--user", "dev")...)
	addKey.Stdin = strings.NewReader(string(devPub))
	if out, err := addKey.CombinedOutput(); err != nil {
		t.Fatalf("bex up: keys:add: %v\n%s", err, out)
	}
	testenv.Eventually(t, time.Minute, app+" on bex up says GREETING=moved", func() error {
		code, body, err := m.get(app, "/cgi-bin/greet")
		if err == nil && (code != 200 || !strings.Contains(body, "moved from hello-shell")) {
			err = fmt.Errorf("%d %q", code, body)
		}
		return err
	})
	// A config var from a Secret (what an operator sets with kubectl: config:set
	// writes plain values), which the doc's first block finds and exports.
	kubectlAt(t, m.kubeconfig(), "create", "secret", "generic", app+"-db", "--from-literal=password=s3cret")
	kubectlAt(t, m.kubeconfig(), "patch", "app", app, "--type", "json", "-p",
		`[{"op":"add","path":"/spec/env/-","value":{"name":"DB_PASSWORD","valueFrom":{"name":"`+app+`-db","key":"password"}}}]`)
	before := releaseNumbers(t, m.kubeconfig(), app)
	if len(before) < 2 {
		t.Fatalf("bex up holds releases %v of %s, want the push's and config:set's", before, app)
	}
	last := before[len(before)-1]

	// The doc's blocks, in a directory laid out as they assume: the single node's
	// kubeconfig at .state/kubeconfig, the cluster's at cluster.kubeconfig.
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, ".state"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{".state/kubeconfig": m.kubeconfig(), "cluster.kubeconfig": env["KUBECONFIG"]} {
		if err := os.Symlink(target, filepath.Join(work, link)); err != nil {
			t.Fatal(err)
		}
	}
	script := movingTheApps(t)
	root, _ := testenv.RepoRoot()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docs/cluster.md's \"4. Moving the apps\" failed: %v\n%s\n--- the script:\n%s", err, out, script)
	}
	t.Logf("the doc's blocks:\n%s", out)

	// On the cluster: the history and the owners.
	if got := releaseNumbers(t, env["KUBECONFIG"], app); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("the cluster holds releases %v of %s, want %v", got, app, before)
	}
	uid := strings.TrimSpace(kubectl(t, "get", "app", app, "-o", "jsonpath={.metadata.uid}"))
	owners := kubectl(t, "get", "releases", "-l", "app.bex.co/app="+app, "-o", "jsonpath={range .items[*]}{.metadata.name}={.metadata.ownerReferences[0].uid}{\"\\n\"}{end}")
	for _, l := range strings.Split(strings.TrimSpace(owners), "\n") {
		if !strings.HasSuffix(l, "="+uid) {
			t.Errorf("release %s is not owned by the cluster's App %s (uid %s)", l, app, uid)
		}
	}

	// Until the push, the App names an image of the single node's containerd, which
	// the cluster cannot pull: the deployer says so.
	testenv.Eventually(t, 2*time.Minute, app+"'s RolledOut condition says its image cannot be pulled", func() error {
		reason := kubectl(t, "get", "app", app, "-o", `jsonpath={.status.conditions[?(@.type=="RolledOut")].reason}`)
		if reason != appv1.ImageNotFoundReason {
			return fmt.Errorf("RolledOut's reason is %q", reason)
		}
		return nil
	})
	t.Logf("before the push, apps:info %s on the cluster:\n%s", app, appsInfo(app))
	// A User both have (admin) holds the keys of both: keys are a list keyed by name.
	if who, err := clusterSSH(adminKey, "whoami"); err != nil || !strings.Contains(who, "admin") {
		t.Errorf("the single node's admin key on the cluster: whoami says %q, %v", who, err)
	}
	if who, _, err := bex("whoami"); err != nil || !strings.Contains(who, "admin") {
		t.Errorf("the cluster's own admin key after the migration: whoami says %q, %v", who, err)
	}

	// The same repository, pushed to the cluster by the migrated user.
	c := repoWithKey(t, "hello-shell", devKey)
	c.dir = r.dir
	c.git(t, "remote", "add", "cluster", clusterRemote(app))
	r.commit(t, "on the cluster", map[string]string{"moved.txt": "moved\n"})
	pushOut, err := c.tryGit("push", "cluster", "main")
	if err != nil {
		t.Fatalf("push to the cluster as dev: %v\n%s\n--- apps:info:\n%s", err, pushOut, appsInfo(app))
	}
	t.Logf("push to the cluster:\n%s", pushOut)
	want := fmt.Sprintf("Deploying release v%d", last+1)
	if !strings.Contains(pushOut, want) {
		t.Errorf("the push to the cluster does not say %q (the release after the migrated v%d):\n%s", want, last, pushOut)
	}
	testenv.Eventually(t, time.Minute, "https://"+app+"."+env["BASE_DOMAIN"]+"/cgi-bin/greet says GREETING=moved", func() error {
		body, err := curl(app, "/cgi-bin/greet")
		if err == nil && !strings.Contains(body, "moved from hello-shell") {
			err = fmt.Errorf("body %q", body)
		}
		return err
	})
	if got := releaseNumbers(t, env["KUBECONFIG"], app); fmt.Sprint(got) != fmt.Sprint(append(before, last+1)) {
		t.Errorf("after the push the cluster holds releases %v, want %v", got, append(before, last+1))
	}
	if rel, _, err := bex("releases", app); err != nil || !strings.Contains(rel, fmt.Sprintf("v%d", last+1)) || !strings.Contains(rel, "v1") {
		t.Errorf("releases %s on the cluster (%v):\n%s", app, err, rel)
	} else {
		t.Logf("releases %s on the cluster:\n%s", app, rel)
	}
	if acc, _, err := bex("access:list", app); err != nil || !strings.Contains(acc, "dev") {
		t.Errorf("access:list %s on the cluster (%v) does not name dev:\n%s", app, err, acc)
	}
	if cfg, _, err := bex("config:get", app, "GREETING"); err != nil || strings.TrimSpace(cfg) != "moved" {
		t.Errorf("config:get %s GREETING on the cluster: %q, %v", app, cfg, err)
	}
	if wh, _, err := bex("webhooks", app); err != nil || !regexp.MustCompile(`(?i)secret.*(set|yes)`).MatchString(wh) {
		t.Errorf("webhooks %s on the cluster (%v) does not say a secret is set:\n%s", app, err, wh)
	}
	// The pod runs, so the kubelet found the Secret its secretKeyRef names.
	if got := kubectl(t, "get", "secret", app+"-db", "-o", "jsonpath={.data.password}"); got != "czNjcmV0" {
		t.Errorf("the cluster's Secret %s-db holds password %q, want base64 of s3cret", app, got)
	}
	if ref := kubectl(t, "get", "deployment", app+"-web", "-o", `jsonpath={.spec.template.spec.containers[0].env[?(@.name=="DB_PASSWORD")].valueFrom.secretKeyRef.name}`); ref != app+"-db" {
		t.Errorf("the Deployment's DB_PASSWORD comes from %q, want the Secret %s-db", ref, app)
	}
	image := kubectl(t, "get", "app", app, "-o", "jsonpath={.spec.image}")
	if !strings.HasPrefix(image, "bex-registry.bex-system.svc.cluster.local:5000/apps/"+app+"@sha256:") {
		t.Errorf("after the push the App runs %q, want an image of the in-cluster registry", image)
	}
	if out, _, err := bex("apps:destroy", app, "--confirm", app); err != nil {
		t.Errorf("apps:destroy %s: %v\n%s", app, err, out)
	}
	// The Secret is the operator's, beside the App, as on one node: not the App's.
	kubectl(t, "delete", "secret", app+"-db")
	testenv.Eventually(t, time.Minute, "the garbage collector deletes "+app+"'s Releases", func() error {
		if left := strings.TrimSpace(kubectl(t, "get", "releases", "-l", "app.bex.co/app="+app, "-o", "name")); left != "" {
			return fmt.Errorf("left: %s", left)
		}
		return nil
	})
}

// movingTheApps is the shell blocks of docs/cluster.md's "4. Moving the apps", in
// order, as one script.
func movingTheApps(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## 4. Moving the apps\n")
	if !ok {
		t.Fatal("docs/cluster.md has no section \"## 4. Moving the apps\"")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)\n```sh\n(.*?)\n```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) == 0 {
		t.Fatal("\"4. Moving the apps\" has no sh block")
	}
	return strings.Join(blocks, "\n")
}

// releaseNumbers lists app's Releases' numbers through kubeconfig, in order.
func releaseNumbers(t testing.TB, kubeconfig, app string) []int64 {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--kubeconfig", kubeconfig, "get", "releases", "-o", "jsonpath={range .items[*]}{.spec.app} {.spec.number}{\"\\n\"}{end}").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get releases: %v\n%s", err, out)
	}
	var ns []int64
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var a string
		var n int64
		if _, err := fmt.Sscan(l, &a, &n); err == nil && a == app {
			ns = append(ns, n)
		}
	}
	for i := 1; i < len(ns); i++ {
		for j := i; j > 0 && ns[j] < ns[j-1]; j-- {
			ns[j], ns[j-1] = ns[j-1], ns[j]
		}
	}
	return ns
}

func appsInfo(app string) string {
	out, errOut, _ := bex("apps:info", app)
	return out + errOut
}

// clusterSSH runs a bex command on the cluster's gitserver as the holder of key.
func clusterSSH(key string, args ...string) (string, error) {
	h, p := sshHostPort()
	fields := strings.Fields(sshCommandWith(key))
	out, err := exec.Command(fields[0], append(append(fields[1:], "-p", p, "git@"+h), args...)...).CombinedOutput()
	return string(out), err
}

// kubectlAt runs the real kubectl with kubeconfig.
func kubectlAt(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
