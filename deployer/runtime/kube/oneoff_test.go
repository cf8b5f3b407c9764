package kube_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
)

// No kubelet runs in envtest: the tests play its part by writing the pod's
// status. infra/cluster runs one-offs on a real node.

func oneOffFixture(t *testing.T) (*fixture, *kube.OneOffs) {
	t.Helper()
	f := setup(t)
	oo, err := kube.NewOneOffs(kube.Config{}, testenv.SharedControlPlane(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	return f, oo
}

// waitPod polls for the pod until it exists, with a deadline.
func (f *fixture) waitPod(name string) *corev1.Pod {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pod := &corev1.Pod{}
		err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, pod)
		if err == nil {
			return pod
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("pod %s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// terminate writes the kubelet's word that the container exited with code.
func (f *fixture) terminate(pod *corev1.Pod, code int32, reason string) {
	f.t.Helper()
	pod.Status.Phase = corev1.PodSucceeded
	if code != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	pod.Status.Reason = reason
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: kube.OneOffContainer, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}},
	}}
	if err := f.c.Status().Update(f.ctx, pod); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) oneOff(id string) runtime.OneOff {
	return runtime.OneOff{
		App: f.app, ID: id, Process: "run." + id, Release: 4, Image: imageA,
		Command: []string{"sh", "-c", "echo $(HOME) $$"},
		Env:     []appv1.EnvVar{{Name: "GREETING", Value: "hi"}, {Name: "PORT", Value: "1"}},
		Timeout: 90 * time.Second,
	}
}

type runResult struct {
	exit int
	err  error
}

func TestOneOffPodSpecAndExitStatus(t *testing.T) {
	f, oo := oneOffFixture(t)
	o := f.oneOff("abc123def456")
	res := make(chan runResult, 1)
	go func() {
		exit, err := oo.Run(f.ctx, o)
		res <- runResult{exit, err}
	}()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))

	if got := pod.Labels; got[appv1.LabelApp] != "hello" || got[appv1.LabelProcess] != "run.abc123def456" ||
		got[appv1.LabelOneOff] != o.ID || got[appv1.LabelRelease] != "4" {
		t.Errorf("labels %v", got)
	}
	if refs := pod.OwnerReferences; len(refs) != 1 || refs[0].UID != f.app.UID || refs[0].Kind != "App" {
		t.Errorf("owner references %+v", refs)
	}
	s := pod.Spec
	if s.RestartPolicy != corev1.RestartPolicyNever || s.ActiveDeadlineSeconds == nil || *s.ActiveDeadlineSeconds != 90 {
		t.Errorf("restartPolicy %q activeDeadlineSeconds %v", s.RestartPolicy, s.ActiveDeadlineSeconds)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("one-off pod gets an API token or service links")
	}
	c := s.Containers[0]
	if c.Stdin || c.TTY {
		t.Errorf("stdin %v tty %v for a run with neither", c.Stdin, c.TTY)
	}
	if want := []string{"sh", "-c", "echo $$(HOME) $$$$"}; len(c.Command) != 3 || c.Command[2] != want[2] {
		t.Errorf("command %q, want %q (literal for Kubernetes)", c.Command, want)
	}
	env := envByName(c.Env)
	if env["PORT"].Value != "8080" || env["GREETING"].Value != "hi" {
		t.Errorf("env %v", c.Env)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("security context %+v", sc)
	}
	if c.Resources.Limits.Memory().Value() != appv1.DefaultMemory {
		t.Errorf("memory limit %v", c.Resources.Limits.Memory())
	}

	f.terminate(pod, 3, "")
	r := <-res
	if r.err != nil || r.exit != 3 {
		t.Fatalf("Run = %d, %v; want 3", r.exit, r.err)
	}
	if !f.gone(&corev1.Pod{}, pod.Name) {
		t.Error("the pod is still there after Run returned")
	}
}

// TestOneOffMountsTheAppsVolumes: a one-off pod has every volume of the app,
// and prefers the node of the app's pods (a claim attaches to one node).
func TestOneOffMountsTheAppsVolumes(t *testing.T) {
	f, oo := oneOffFixture(t)
	app := f.app.DeepCopy()
	app.Spec.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("1Gi"), Processes: []string{"worker"}}}
	o := f.oneOff("0123456789ab")
	o.App = app
	res := make(chan runResult, 1)
	go func() {
		exit, err := oo.Run(f.ctx, o)
		res <- runResult{exit, err}
	}()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))
	s := pod.Spec
	if len(s.Volumes) != 1 || s.Volumes[0].PersistentVolumeClaim == nil || s.Volumes[0].PersistentVolumeClaim.ClaimName != kube.VolumeClaimName("hello", "data") ||
		len(s.Containers[0].VolumeMounts) != 1 || s.Containers[0].VolumeMounts[0].MountPath != "/data" {
		t.Errorf("volumes %+v, mounts %+v", s.Volumes, s.Containers[0].VolumeMounts)
	}
	if s.Affinity == nil || s.Affinity.PodAffinity == nil || len(s.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		s.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels[appv1.LabelApp] != "hello" {
		t.Errorf("affinity %+v", s.Affinity)
	}
	f.terminate(pod, 0, "")
	if r := <-res; r.err != nil || r.exit != 0 {
		t.Fatalf("Run = %d, %v", r.exit, r.err)
	}
}

func TestOneOffDeadlineIs137(t *testing.T) {
	f, oo := oneOffFixture(t)
	o := f.oneOff("deadline0001")
	res := make(chan runResult, 1)
	go func() {
		exit, err := oo.Run(f.ctx, o)
		res <- runResult{exit, err}
	}()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))
	f.terminate(pod, 143, "DeadlineExceeded")
	if r := <-res; r.err != nil || r.exit != 137 {
		t.Fatalf("Run = %d, %v; want 137", r.exit, r.err)
	}
}

func TestOneOffGoesWhenCtxEnds(t *testing.T) {
	f, oo := oneOffFixture(t)
	o := f.oneOff("ctxends00001")
	o.Stdin = nilReader{}
	o.TTY = &runtime.TTY{Term: "xterm", Width: 80, Height: 24}
	ctx, cancel := context.WithCancel(f.ctx)
	res := make(chan runResult, 1)
	go func() {
		exit, err := oo.Run(ctx, o)
		res <- runResult{exit, err}
	}()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))
	c := pod.Spec.Containers[0]
	if !c.Stdin || !c.StdinOnce || !c.TTY || envByName(c.Env)["TERM"].Value != "xterm" {
		t.Errorf("stdin %v stdinOnce %v tty %v env %v", c.Stdin, c.StdinOnce, c.TTY, c.Env)
	}
	cancel()
	if r := <-res; r.err == nil || r.exit != -1 {
		t.Fatalf("Run = %d, %v; want -1 and an error", r.exit, r.err)
	}
	if !f.gone(&corev1.Pod{}, pod.Name) {
		t.Error("the pod is still there after ctx ended")
	}
}

func TestOneOffStartCallsDone(t *testing.T) {
	f, oo := oneOffFixture(t)
	o := f.oneOff("start0000001")
	o.Process = "postdeploy"
	started := make(chan error, 1)
	done := make(chan int, 1)
	go func() { started <- oo.Start(f.ctx, o, func(exit int) { done <- exit }) }()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: kube.OneOffContainer, Image: imageA,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if err := f.c.Status().Update(f.ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	select {
	case exit := <-done:
		t.Fatalf("done(%d) while the pod runs", exit)
	default:
	}
	f.terminate(pod, 0, "")
	if exit := <-done; exit != 0 {
		t.Fatalf("done(%d), want 0", exit)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !f.gone(&corev1.Pod{}, pod.Name) {
		if time.Now().After(deadline) {
			t.Fatal("the pod is still there after it ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type nilReader struct{}

func (nilReader) Read([]byte) (int, error) { select {} }
