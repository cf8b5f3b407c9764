package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func TestControlPlaneServesBexCRDs(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ctx := context.Background()
	for _, name := range []string{"apps.app.bex.co", "releases.app.bex.co", "users.app.bex.co"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			t.Errorf("CRD %s: %v", name, err)
		}
	}
	// The kubeconfig works for the real kubectl, as it will for users of `bex up`.
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "get", "apps", "-A").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get apps: %v\n%s", err, out)
	}
}

// build builds the Dockerfile in dir with the real buildkitd into containerd as
// image name, and returns the digest BuildKit reports.
func build(t *testing.T, bk *testenv.Buildkitd, dir, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	digest, log, err := bk.BuildImage(ctx, dir, dir, name)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if !strings.HasPrefix(digest, "sha256:") || log == "" {
		t.Fatalf("build %s: digest %q, steps %q", name, digest, log)
	}
	return digest
}

func TestBuildFromScratchAndRunInContainerd(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	dir := t.TempDir()
	// A static Go binary is the whole image.
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from scratch\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gobuild := exec.Command("go", "build", "-o", "hello", ".")
	gobuild.Dir = dir
	gobuild.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := gobuild.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM scratch\nCOPY hello /hello\nCMD [\"/hello\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const name = "docker.io/library/testenv-scratch:1"
	build(t, bk, dir, name)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := bk.Containerd.Run(ctx, name)
	if err != nil || code != 0 || out != "hello from scratch" {
		t.Fatalf("run %s: output %q, exit %d, err %v", name, out, code, err)
	}
}

func TestBuildFromBusyboxWithRunStep(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	dir := t.TempDir()
	dockerfile := "FROM busybox\nRUN echo \"built by $(id -un) with $(sh -c 'echo busybox')\" > /built.txt\nCMD [\"cat\", \"/built.txt\"]\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	const name = "docker.io/library/testenv-busybox:1"
	build(t, bk, dir, name)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := bk.Containerd.Run(ctx, name)
	if err != nil || code != 0 || out != "built by root with busybox" {
		t.Fatalf("run %s: output %q, exit %d, err %v", name, out, code, err)
	}
	// A failing command reports its exit code: Run does not hide failures.
	if _, code, err := bk.Containerd.Run(ctx, name, "sh", "-c", "exit 3"); err != nil || code != 3 {
		t.Fatalf("exit 3: got code %d, err %v", code, err)
	}
}

func TestPebbleAnswersItsDirectory(t *testing.T) {
	p := testenv.SharedPebble(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir, err := p.Directory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"newNonce", "newAccount", "newOrder"} {
		u, _ := dir[key].(string)
		if !strings.HasPrefix(u, "https://127.0.0.1:") {
			t.Errorf("directory %s = %q", key, dir[key])
		}
	}
	// The root that signs the test certificates is served for clients to trust.
	resp, err := p.Client().Get(p.ManagementURL + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /roots/0: %s", resp.Status)
	}
}

func TestMissingBinaryNamesTheFix(t *testing.T) {
	_, err := testenv.Binary("no-such-daemon-bex")
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("want an error that says to run make tools, got %v", err)
	}
}
