package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/testregistry"
)

// TestDeployImageOnTheCluster: deploy:image on the cluster, from a private
// registry elsewhere (distribution's, served by this test inside the node's
// network namespace: the gitserver's pod reaches it at the node's address, as a
// registry on the LAN; the node runs the gitserver with
// --allow-private-registries). Refused before registry:login with a sentence
// saying so; after it, the image is copied into the cluster's registry,
// released with cause Image, rolled out and served over HTTPS; rollback goes
// back to the git release and forward to the image again.
func TestDeployImageOnTheCluster(t *testing.T) {
	bin, err := testenv.Binary("busybox")
	if err != nil {
		t.Fatal(err)
	}
	reg := testregistry.StartPrivateOn(t, listenInNode(t), "ci", "s3cret-pw")
	ref := reg.Host + "/team/web:v1"
	digest := testregistry.Push(t, ref, testregistry.ServingImage(t, bin, "from the private registry\n"), "ci", "s3cret-pw")

	const app = "imaged"
	r := newRepo(t, "hello-shell", app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", time.Minute)

	_, e, err := bex("deploy:image", app, ref)
	if err == nil || !strings.Contains(e, reg.Host+" needs a login to pull "+ref) || !strings.Contains(e, "registry:login "+reg.Host) {
		t.Fatalf("a private image before registry:login: %v\n%s", err, e)
	}
	login := func(password string) (string, string, error) {
		h, p := sshHostPort()
		fields := strings.Fields(sshCommand())
		cmd := exec.Command(fields[0], append(fields[1:], "-p", p, "git@"+h, "registry:login", reg.Host, "ci", "--password-stdin")...)
		cmd.Stdin = strings.NewReader(password + "\n")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	if out, e, err := login("s3cret-pw"); err != nil || !strings.Contains(out, "Logged in to "+reg.Host+" as ci") {
		t.Fatalf("registry:login: %v %s %s", err, out, e)
	}
	t.Cleanup(func() { _, _, _ = bex("registry:logout", reg.Host) })

	start := time.Now()
	out, e, err := bex("deploy:image", app, ref)
	if err != nil || !strings.HasPrefix(out, "v2 serves at https://"+app+"."+env["BASE_DOMAIN"]) {
		t.Fatalf("deploy:image after registry:login: %v\n%s\n%s", err, out, e)
	}
	for _, want := range []string{"-----> Resolved " + ref + " to " + reg.Host + "/team/web@sha256:", "-----> Deploying release v2", "-----> Application deployed: release v2"} {
		if !strings.Contains(e, want) {
			t.Errorf("no %q in the progress:\n%s", want, e)
		}
	}
	t.Logf("deploy:image in %.1f s", time.Since(start).Seconds())
	waitBody(t, app, "/", "from the private registry", time.Minute)
	image := kubectl(t, "get", "deployment", app+"-web", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if want := "bex-registry.bex-system.svc.cluster.local:5000/apps/" + app + "@" + digest[strings.Index(digest, "@")+1:]; image != want {
		t.Errorf("the Deployment runs %q, want the image copied into the cluster's registry, %s", image, want)
	}
	var rels []map[string]any
	if err := json.Unmarshal([]byte(bexOK(t, "releases", app, "--json")), &rels); err != nil {
		t.Fatal(err)
	}
	if len(rels) != 2 || rels[0]["cause"] != "Image" {
		t.Errorf("releases: %v", rels)
	}

	// Image → git → image.
	bexOK(t, "rollback", app, "v1")
	waitBody(t, app, "/", "hello from bex", 2*time.Minute)
	bexOK(t, "rollback", app, "v2")
	waitBody(t, app, "/", "from the private registry", 2*time.Minute)
}

// listenInNode listens on a port of the node's address inside the node's
// network namespace (NODE_NETNS): its pods reach it there, and the host, whose
// end of the node's link opens connections into the node, does too.
func listenInNode(t *testing.T) net.Listener {
	t.Helper()
	if env["NODE_NETNS"] == "" || env["NODE_IP"] == "" {
		t.Fatal("cluster.env has no NODE_NETNS and NODE_IP: a cluster made before they were written; hack/cluster-local.sh up a new one")
	}
	ln, err := inNetns(env["NODE_NETNS"], func() (net.Listener, error) { return net.Listen("tcp", net.JoinHostPort(env["NODE_IP"], "0")) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// inNetns calls f on an OS thread moved into the network namespace at path,
// and moves the thread back. A socket keeps the namespace it was made in.
func inNetns[T any](path string, f func() (T, error)) (T, error) {
	var zero T
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return zero, err
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return zero, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return zero, fmt.Errorf("setns %s: %w", path, err)
	}
	v, ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked: Go ends it with its goroutine rather than
		// run other goroutines in the node's namespace.
		return zero, fmt.Errorf("setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return v, ferr
}
