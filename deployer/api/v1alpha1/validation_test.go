package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// These tests install the generated CRDs into a real kube-apiserver and check that
// the API server itself accepts valid objects and refuses each kind of bad input
// with a message that names the field.

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func validApp(name string) *appv1.App {
	return &appv1.App{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appv1.AppSpec{
			Image:   "registry.example/hello@" + digest,
			Release: 7,
			Processes: map[string]appv1.ProcessSpec{
				"web":    {Command: []string{"./server"}, Replicas: 2},
				"worker": {Command: []string{"./worker"}, Replicas: 1},
			},
			Env:         []appv1.EnvVar{{Name: "GREETING", Value: "hi"}, {Name: "DB_PASSWORD", ValueFrom: &appv1.SecretKeySelector{Name: "db", Key: "password"}}},
			Domains:     []string{"hello.example.com", "*.apps.example.org"},
			HealthCheck: &appv1.HealthCheck{Path: "/healthz", BootTimeoutSeconds: 60},
			Git:         appv1.GitSpec{DeployBranch: "release/2026", Upstream: "https://git.example/hello.git"},
			Build: appv1.BuildSpec{Dir: "services/web", Dockerfile: "docker/Dockerfile.prod", Target: "release",
				Args: []appv1.BuildArg{{Name: "GO_VERSION", Value: "1.26"}}},
			Members: []string{"ana"},
			Volumes: []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("10Gi")},
				{Name: "uploads", Path: "/srv/app/uploads", Size: resource.MustParse("16Mi"), Processes: []string{"web"}}},
		},
	}
}

func withVolume(name string, v appv1.Volume) client.Object {
	a := validApp(name)
	a.Spec.Volumes = []appv1.Volume{v}
	return a
}

func validRelease(name string) *appv1.Release {
	return &appv1.Release{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appv1.ReleaseSpec{
			App:    "hello",
			Number: 7,
			Image:  "registry.example/hello@" + digest,
			Commit: "0123456789abcdef0123456789abcdef01234567",
			Config: appv1.ReleaseConfig{
				Env:       []appv1.EnvVar{{Name: "GREETING", Value: "hi"}},
				Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}},
			},
			Cause: appv1.ReleaseCausePush,
			Actor: "ana",
		},
	}
}

func validUser(name string) *appv1.User {
	return &appv1.User{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appv1.UserSpec{
			Role: appv1.RoleMember,
			Keys: []appv1.SSHKey{{Name: "laptop", PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx1cmtpbmcga2V5IGZvciB0ZXN0cyBvbmx5IQ== ana@laptop"}},
		},
	}
}

func TestValidObjectsAreAccepted(t *testing.T) {
	c := testenv.SharedControlPlane(t).Client
	ctx := context.Background()
	for _, obj := range []client.Object{validApp("hello"), validRelease("hello-v7"), validUser("ana")} {
		if err := c.Create(ctx, obj); err != nil {
			t.Errorf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	// The status subresource takes a valid phase.
	app := &appv1.App{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "hello"}, app); err != nil {
		t.Fatal(err)
	}
	app.Status = appv1.AppStatus{Phase: appv1.AppPhaseRunning, Revision: 7, URL: "https://hello.example.com", ObservedGeneration: app.Generation}
	if err := c.Status().Update(ctx, app); err != nil {
		t.Errorf("status update: %v", err)
	}
	// The shortest valid app name and the longest one.
	for _, name := range []string{"a", strings.Repeat("a", appv1.MaxAppNameLength)} {
		if err := c.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); err != nil {
			t.Errorf("app name %q (%d characters): %v", name, len(name), err)
		}
	}
}

func TestInvalidObjectsAreRejectedNamingTheField(t *testing.T) {
	c := testenv.SharedControlPlane(t).Client
	ctx := context.Background()
	cases := []struct {
		name  string
		obj   client.Object
		field string // the field path the API server's message must name
	}{
		{"app name longer than 40", func() client.Object { return validApp(strings.Repeat("a", 41)) }(), "metadata.name"},
		{"app name not a DNS label", validApp("hello.world"), "metadata.name"},
		{"app name with underscore", validApp("hello_world"), "metadata.name"},
		{"image without digest", func() client.Object {
			a := validApp("img-tag")
			a.Spec.Image = "registry.example/hello:latest"
			return a
		}(), "spec.image"},
		{"image with a short digest", func() client.Object { a := validApp("img-short"); a.Spec.Image = "hello@sha256:abc"; return a }(), "spec.image"},
		{"negative release", func() client.Object { a := validApp("neg-release"); a.Spec.Release = -1; return a }(), "spec.release"},
		{"negative replicas", func() client.Object {
			a := validApp("neg-replicas")
			a.Spec.Processes["web"] = appv1.ProcessSpec{Replicas: -1}
			return a
		}(), "spec.processes.web.replicas"},
		{"replicas above the maximum", func() client.Object {
			a := validApp("many-replicas")
			a.Spec.Processes["web"] = appv1.ProcessSpec{Replicas: appv1.MaxReplicas + 1}
			return a
		}(), "spec.processes.web.replicas"},
		{"process type name", func() client.Object {
			a := validApp("bad-process")
			a.Spec.Processes["Web_1"] = appv1.ProcessSpec{Replicas: 1}
			return a
		}(), "spec.processes"},
		{"env name not POSIX", func() client.Object {
			a := validApp("bad-env")
			a.Spec.Env = []appv1.EnvVar{{Name: "1GREETING", Value: "hi"}}
			return a
		}(), "spec.env[0].name"},
		{"env name with a dash", func() client.Object {
			a := validApp("dash-env")
			a.Spec.Env = []appv1.EnvVar{{Name: "MY-VAR", Value: "hi"}}
			return a
		}(), "spec.env[0].name"},
		{"env value and valueFrom", func() client.Object {
			a := validApp("both-env")
			a.Spec.Env = []appv1.EnvVar{{Name: "X", Value: "v", ValueFrom: &appv1.SecretKeySelector{Name: "s", Key: "k"}}}
			return a
		}(), "spec.env[0]"},
		{"domain with a space", func() client.Object {
			a := validApp("bad-domain")
			a.Spec.Domains = []string{"hello example.com"}
			return a
		}(), "spec.domains[0]"},
		{"domain with upper case", func() client.Object {
			a := validApp("upper-domain")
			a.Spec.Domains = []string{"Hello.example.com"}
			return a
		}(), "spec.domains[0]"},
		{"domain with a scheme", func() client.Object {
			a := validApp("url-domain")
			a.Spec.Domains = []string{"https://hello.example.com"}
			return a
		}(), "spec.domains[0]"},
		{"health check path", func() client.Object {
			a := validApp("bad-health")
			a.Spec.HealthCheck = &appv1.HealthCheck{Path: "healthz"}
			return a
		}(), "spec.healthCheck.path"},
		{"deploy branch", func() client.Object { a := validApp("bad-branch"); a.Spec.Git.DeployBranch = "main..dev"; return a }(), "spec.git.deployBranch"},
		{"upstream not a git URL", func() client.Object {
			a := validApp("bad-upstream")
			a.Spec.Git.Upstream = "http://example.com/x.git"
			return a
		}(), "spec.git.upstream"},
		{"build dir leaving the repository", func() client.Object { a := validApp("bad-build-dir"); a.Spec.Build.Dir = "../other"; return a }(), "spec.build.dir"},
		{"absolute build dir", func() client.Object { a := validApp("abs-build-dir"); a.Spec.Build.Dir = "/etc"; return a }(), "spec.build.dir"},
		{"dockerfile path leaving", func() client.Object { a := validApp("bad-dockerfile"); a.Spec.Build.Dockerfile = "a/../../b"; return a }(), "spec.build.dockerfile"},
		{"build arg name", func() client.Object {
			a := validApp("bad-arg")
			a.Spec.Build.Args = []appv1.BuildArg{{Name: "GO-VERSION"}}
			return a
		}(), "spec.build.args[0].name"},
		{"member not a user name", func() client.Object { a := validApp("bad-member"); a.Spec.Members = []string{"Ana Lopez"}; return a }(), "spec.members[0]"},
		{"release without image", func() client.Object { r := validRelease("no-image-v1"); r.Spec.Image = ""; return r }(), "spec.image"},
		{"release image not pinned", func() client.Object { r := validRelease("tag-v1"); r.Spec.Image = "hello:v1"; return r }(), "spec.image"},
		{"release number 0", func() client.Object { r := validRelease("zero-v0"); r.Spec.Number = 0; return r }(), "spec.number"},
		{"release cause", func() client.Object { r := validRelease("cause-v1"); r.Spec.Cause = "Whim"; return r }(), "spec.cause"},
		{"release commit", func() client.Object { r := validRelease("commit-v1"); r.Spec.Commit = "HEAD"; return r }(), "spec.commit"},
		{"release app name", func() client.Object { r := validRelease("app-v1"); r.Spec.App = "Hello"; return r }(), "spec.app"},
		{"user role", func() client.Object { u := validUser("role"); u.Spec.Role = "root"; return u }(), "spec.role"},
		{"user key", func() client.Object {
			u := validUser("key")
			u.Spec.Keys = []appv1.SSHKey{{Name: "laptop", PublicKey: "-----BEGIN OPENSSH PRIVATE KEY-----"}}
			return u
		}(), "spec.keys[0].publicKey"},
		{"user name", validUser("ana.lopez"), "metadata.name"},
		{"volume name", withVolume("vol-name", appv1.Volume{Name: "../x", Path: "/data", Size: resource.MustParse("1Gi")}), "spec.volumes[0].name"},
		{"volume path relative", withVolume("vol-rel", appv1.Volume{Name: "d", Path: "data", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume path with ..", withVolume("vol-dots", appv1.Volume{Name: "d", Path: "/data/../etc", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume path /", withVolume("vol-root", appv1.Volume{Name: "d", Path: "/", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume path under /proc", withVolume("vol-proc", appv1.Volume{Name: "d", Path: "/proc/self", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume path /dev", withVolume("vol-dev", appv1.Volume{Name: "d", Path: "/dev", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume path with a trailing /", withVolume("vol-slash", appv1.Volume{Name: "d", Path: "/data/", Size: resource.MustParse("1Gi")}), "spec.volumes[0].path"},
		{"volume too small", withVolume("vol-small", appv1.Volume{Name: "d", Path: "/data", Size: resource.MustParse("1Mi")}), "spec.volumes[0]"},
		{"volume too large", withVolume("vol-large", appv1.Volume{Name: "d", Path: "/data", Size: resource.MustParse("17Ti")}), "spec.volumes[0]"},
		{"two volumes on one path", func() client.Object {
			a := validApp("vol-same-path")
			a.Spec.Volumes = []appv1.Volume{{Name: "a", Path: "/data", Size: resource.MustParse("1Gi")}, {Name: "b", Path: "/data", Size: resource.MustParse("1Gi")}}
			return a
		}(), "spec.volumes"},
		{"too many volumes", func() client.Object {
			a := validApp("vol-many")
			for i := range appv1.MaxVolumes + 1 {
				a.Spec.Volumes = append(a.Spec.Volumes, appv1.Volume{Name: fmt.Sprintf("v%d", i), Path: fmt.Sprintf("/v%d", i), Size: resource.MustParse("1Gi")})
			}
			return a
		}(), "spec.volumes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Create(ctx, tc.obj)
			if err == nil {
				t.Fatalf("the API server accepted it; want a rejection naming %s", tc.field)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error naming %s, got %v", tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("the message does not name %s: %v", tc.field, err)
			}
		})
	}
}

func TestInvalidPhaseIsRejected(t *testing.T) {
	c := testenv.SharedControlPlane(t).Client
	ctx := context.Background()
	app := validApp("bad-phase")
	if err := c.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	app.Status.Phase = "Exploded"
	err := c.Status().Update(ctx, app)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.phase") {
		t.Fatalf("want an Invalid error naming status.phase, got %v", err)
	}
}

func TestReleaseSpecIsImmutable(t *testing.T) {
	c := testenv.SharedControlPlane(t).Client
	ctx := context.Background()
	rel := validRelease("immutable-v1")
	if err := c.Create(ctx, rel); err != nil {
		t.Fatal(err)
	}
	changes := map[string]func(*appv1.Release){
		"image":  func(r *appv1.Release) { r.Spec.Image = "other@" + digest },
		"number": func(r *appv1.Release) { r.Spec.Number = 8 },
		"env":    func(r *appv1.Release) { r.Spec.Config.Env[0].Value = "changed" },
	}
	for what, change := range changes {
		t.Run(what, func(t *testing.T) {
			cur := &appv1.Release{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(rel), cur); err != nil {
				t.Fatal(err)
			}
			change(cur)
			err := c.Update(ctx, cur)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
				t.Fatalf("want the update refused as immutable, got %v", err)
			}
		})
	}
	// Metadata stays writable: labels and owner references are how Releases are found
	// and garbage-collected.
	cur := &appv1.Release{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(rel), cur); err != nil {
		t.Fatal(err)
	}
	cur.Labels = map[string]string{"app.bex.co/app": "hello"}
	if err := c.Update(ctx, cur); err != nil {
		t.Fatalf("a label update was refused: %v", err)
	}
}
