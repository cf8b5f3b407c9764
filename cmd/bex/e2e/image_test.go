package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// TestDeployImage: deploy:image end to end, with bex up as its own process and
// the real ssh, against real registries (distribution's, on loopback, which
// bex up may reach because it runs with --allow-private-registries): an image
// deploys and serves over HTTPS like a push; one that does not exist is
// refused naming it; a private one is refused before registry:login, with a
// sentence saying so, and serves after it (the password in no log, output or
// App spec); rollback goes from a git release to an image release and back.
func TestDeployImage(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	p.start(t, "--allow-private-registries")

	bin, err := testenv.Binary("busybox")
	if err != nil {
		t.Fatal(err)
	}
	pub := testregistry.Start(t, false)
	priv := testregistry.StartPrivate(t, "ci", "s3cret-pw")
	served := testregistry.ServingImage(t, bin, "from the public registry\n")
	testregistry.Push(t, pub.Host+"/demo/web:v1", served, "", "")
	testregistry.Push(t, pub.Host+"/demo/web:broken", testregistry.WithCmd(t, served, "/bin/busybox", "sh", "-c", "echo broken; exit 3"), "", "")
	privDigest := testregistry.Push(t, priv.Host+"/team/web:v1", testregistry.ServingImage(t, bin, "from the private registry\n"), "ci", "s3cret-pw")

	const app = "imaged"
	ssh := func(args ...string) (string, string, error) { return p.ssh(t, quoteWords(args)...) }
	if _, e, err := ssh("apps:create", app); err != nil {
		t.Fatalf("apps:create: %v %s", err, e)
	}
	releases := func() []map[string]any {
		out, e, err := ssh("releases", app, "--json")
		if err != nil {
			t.Fatalf("releases: %v %s", err, e)
		}
		var rs []map[string]any
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatal(err)
		}
		return rs
	}

	out, e, err := ssh("deploy:image", app, pub.Host+"/demo/web:v1")
	if err != nil {
		t.Fatalf("deploy:image: %v\n%s\n%s", err, out, e)
	}
	for _, want := range []string{"-----> Pulling " + pub.Host + "/demo/web:v1", "-----> Resolved " + pub.Host + "/demo/web:v1 to " + pub.Host + "/demo/web@sha256:",
		"-----> Releasing bex.local/" + app + "@sha256:", "-----> Deploying release v1", "-----> Application deployed: release v1"} {
		if !strings.Contains(e, want) {
			t.Errorf("no %q in the progress:\n%s", want, e)
		}
	}
	if !strings.HasPrefix(out, "v1 serves at https://"+app+".localhost:") {
		t.Errorf("deploy:image printed %q", out)
	}
	if err := p.answers(app, "/", "from the public registry")(); err != nil {
		t.Fatal(err)
	}
	if rs := releases(); len(rs) != 1 || rs[0]["cause"] != "Image" || rs[0]["description"] != "Deploy image "+pub.Host+"/demo/web:v1" {
		t.Errorf("releases: %v", rs)
	}

	// An image that does not exist: refused with its reference, nothing released.
	_, e, err = ssh("deploy:image", app, pub.Host+"/demo/web:nope")
	if err == nil || !strings.Contains(e, "bex: "+pub.Host+"/demo/web:nope does not exist in "+pub.Host) {
		t.Errorf("a missing image: %v\n%s", err, e)
	}
	// A private one, before a login: refused, saying what to do.
	_, e, err = ssh("deploy:image", app, priv.Host+"/team/web:v1")
	if err == nil || !strings.Contains(e, priv.Host+" needs a login to pull "+priv.Host+"/team/web:v1") || !strings.Contains(e, "registry:login "+priv.Host) {
		t.Errorf("a private image before registry:login: %v\n%s", err, e)
	}
	if n := len(releases()); n != 1 {
		t.Errorf("%d releases after two refusals", n)
	}
	if err := p.answers(app, "/", "from the public registry")(); err != nil {
		t.Fatal(err)
	}

	// An image that does not come up: rejected as a push's rollout is, the
	// previous release serving on.
	start := time.Now()
	_, e, err = ssh("deploy:image", app, pub.Host+"/demo/web:broken")
	if err == nil || !strings.Contains(e, "bex: deploy failed: release v2 did not serve: rollout failed: web.1 keeps exiting") ||
		!strings.Contains(e, "Release v1 keeps serving") || !strings.Contains(e, "-----> Deploying release v2") {
		t.Errorf("an image that does not serve: %v\n%s", err, e)
	}
	t.Logf("the broken image was rejected in %s", time.Since(start).Round(time.Second))
	if err := p.answers(app, "/", "from the public registry")(); err != nil {
		t.Fatal(err)
	}

	login := func(password string) (string, string, error) {
		fields := strings.Fields(p.sshCommand())
		cmd := exec.Command(fields[0], append(fields[1:], "-p", p.port(p.sshAddr), "git@127.0.0.1", "registry:login", priv.Host, "ci", "--password-stdin")...)
		cmd.Stdin = strings.NewReader(password + "\n")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	if _, e, err := login("wrong-pw"); err == nil || !strings.Contains(e, priv.Host+" refused the password of ci") {
		t.Errorf("registry:login with a wrong password: %v %s", err, e)
	}
	if out, e, err := login("s3cret-pw"); err != nil || !strings.Contains(out, "Logged in to "+priv.Host+" as ci") {
		t.Fatalf("registry:login: %v %s %s", err, out, e)
	}
	var kept []map[string]string
	if out, _, err := ssh("registry", "--json"); err != nil || json.Unmarshal([]byte(out), &kept) != nil || len(kept) != 1 ||
		kept[0]["host"] != priv.Host || kept[0]["username"] != "ci" || strings.Contains(out, "s3cret") {
		t.Errorf("registry --json: %v %s", err, out)
	}
	out, e, err = ssh("deploy:image", app, priv.Host+"/team/web:v1")
	if err != nil || !strings.HasPrefix(out, "v3 serves at") {
		t.Fatalf("deploy:image of the private image after registry:login: %v\n%s\n%s", err, out, e)
	}
	if err := p.answers(app, "/", "from the private registry")(); err != nil {
		t.Fatal(err)
	}
	if img := p.kubectl(t, "get", "app", app, "-o", "jsonpath={.spec.image}"); img != "bex.local/"+app+"@"+privDigest[strings.Index(privDigest, "@")+1:] {
		t.Errorf("spec.image %s, the private registry has %s", img, privDigest)
	}

	// Rollback between git and image releases, both ways: a push (v4), back to
	// the private image (v5), back to the push (v6).
	r := p.newRepo(t, "hello-shell", app)
	if out, err := r.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if err := p.answers(app, "/", "hello from bex")(); err != nil {
		t.Fatal(err)
	}
	if out, e, err := ssh("rollback", app); err != nil || !strings.Contains(out, "Rolled "+app+" back to v3: release v5.") {
		t.Fatalf("rollback to the image: %v %s %s", err, out, e)
	}
	if err := p.answers(app, "/", "from the private registry")(); err != nil {
		t.Fatal(err)
	}
	if out, e, err := ssh("rollback", app, "v4"); err != nil || !strings.Contains(out, "release v6") {
		t.Fatalf("rollback to the push: %v %s %s", err, out, e)
	}
	if err := p.answers(app, "/", "hello from bex")(); err != nil {
		t.Fatal(err)
	}

	// registry:logout forgets the login: the private image is refused again.
	if out, e, err := ssh("registry:logout", priv.Host); err != nil || !strings.Contains(out, "Logged out of "+priv.Host) {
		t.Fatalf("registry:logout: %v %s %s", err, out, e)
	}
	if _, e, err := ssh("deploy:image", app, priv.Host+"/team/web:v1"); err == nil || !strings.Contains(e, "needs a login") {
		t.Errorf("after registry:logout: %v %s", err, e)
	}

	// The password is in no log, no App or Release, no output.
	spec := p.kubectl(t, "get", "apps,releases", "-o", "yaml")
	logs := p.out.String()
	filepath.WalkDir(filepath.Join(p.dir, "logs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b, _ := os.ReadFile(path)
			logs += string(b)
		}
		return nil
	})
	for what, text := range map[string]string{"the Apps and Releases": spec, "bex up's logs": logs} {
		if strings.Contains(text, "s3cret-pw") || strings.Contains(text, "wrong-pw") {
			t.Errorf("a password is in %s", what)
		}
	}
	if !strings.Contains(logs, "registry:login") {
		t.Errorf("no audit line of registry:login in the logs (were they read?)")
	}
}
