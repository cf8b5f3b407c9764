package infra

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
)

// TestAppsNamespaceEnforcesBaseline applies infra/bex and has the API server's
// Pod Security admission judge pods in the apps' namespace: the pod the kube
// runtime makes of an app (its Deployment's template) is admitted, and a pod
// that would reach the node (privileged, the host's network, a hostPath, a
// capability beyond the apps' set) is refused, whoever creates it (the
// gitserver may create pods there for one-offs).
func TestAppsNamespaceEnforcesBaseline(t *testing.T) {
	applyBex(t)
	cp := controlPlane(t)
	ctx := context.Background()

	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe", Namespace: "default"}}
	if err := cp.Client.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(ctx, app) })
	rt, err := kube.New(kube.Config{}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	d := runtime.Desired{App: app, Release: 1, Image: "registry.example/psa@sha256:" + strings.Repeat("a", 64),
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}
	if _, err := rt.Sync(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(ctx, d.Key()) })
	dep := &appsv1.Deployment{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: kube.DeploymentName(app.Name, "web")}, dep); err != nil {
		t.Fatal(err)
	}

	create := func(name string, mod func(*corev1.PodSpec)) error {
		spec := dep.Spec.Template.Spec.DeepCopy()
		mod(spec)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: *spec}
		return cp.Client.Create(ctx, pod, client.DryRunAll)
	}
	if err := create("app", func(*corev1.PodSpec) {}); err != nil {
		t.Fatalf("the app's own pod is refused: %v", err)
	}
	for name, mod := range map[string]func(*corev1.PodSpec){
		"privileged": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Privileged = ptr(true)
			s.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		},
		// With hostUsers (the API refuses host namespaces in a pod's own user
		// namespace before Pod Security sees it).
		"host-network": func(s *corev1.PodSpec) { s.HostNetwork, s.HostUsers = true, ptr(true) },
		"host-pid":     func(s *corev1.PodSpec) { s.HostPID, s.HostUsers = true, ptr(true) },
		"host-path": func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		},
		"sys-admin": func(s *corev1.PodSpec) {
			c := s.Containers[0].SecurityContext.Capabilities
			c.Add = append(c.Add, "SYS_ADMIN")
		},
		"net-raw": func(s *corev1.PodSpec) {
			c := s.Containers[0].SecurityContext.Capabilities
			c.Add = append(c.Add, "NET_RAW")
		},
	} {
		err := create(name, mod)
		if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Errorf("a %s pod in the apps' namespace: %v, want refused by Pod Security", name, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }
