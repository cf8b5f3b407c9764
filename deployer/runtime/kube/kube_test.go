package kube_test

import (
	"context"
	"k8s.io/utils/ptr"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

const (
	imageA = "registry.example/hello@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	imageB = "registry.example/hello@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// fixture is one test's namespace, App and runtime on the shared control plane.
//
// No kube-controller-manager or kubelet runs in envtest: nothing creates ReplicaSets
// or pods, and nothing writes a Deployment's status. Tests play the Deployment
// controller's part by writing the status themselves (setStatus, complete).
type fixture struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
	ns  string
	app *appv1.App
	rt  *kube.Runtime
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "kube")
	ctx := context.Background()
	// The App exists first: Sync writes owner references to its UID.
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns}}
	if err := cp.Client.Create(ctx, app); err != nil {
		t.Fatal(err)
	}
	rt, err := kube.New(kube.Config{}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: ctx, c: cp.Client, ns: ns, app: app, rt: rt}
}

func (f *fixture) desired(release int64, image string, processes map[string]appv1.ProcessSpec) runtime.Desired {
	return runtime.Desired{App: f.app, Release: release, Image: image, Processes: processes}
}

func (f *fixture) sync(d runtime.Desired) runtime.Status {
	f.t.Helper()
	st, err := f.rt.Sync(f.ctx, d)
	if err != nil {
		f.t.Fatalf("Sync: %v", err)
	}
	return st
}

func (f *fixture) deployment(name string) *appsv1.Deployment {
	f.t.Helper()
	dep := &appsv1.Deployment{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, dep); err != nil {
		f.t.Fatalf("get deployment %s: %v", name, err)
	}
	return dep
}

func (f *fixture) service() *corev1.Service {
	f.t.Helper()
	svc := &corev1.Service{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "hello"}, svc); err != nil {
		f.t.Fatalf("get service: %v", err)
	}
	return svc
}

func (f *fixture) gone(obj client.Object, name string) bool {
	f.t.Helper()
	err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, obj)
	if err != nil && !apierrors.IsNotFound(err) {
		f.t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

// setStatus writes a Deployment's status as the Deployment controller would.
func (f *fixture) setStatus(name string, mod func(dep *appsv1.Deployment)) {
	f.t.Helper()
	dep := f.deployment(name)
	mod(dep)
	if err := f.c.Status().Update(f.ctx, dep); err != nil {
		f.t.Fatalf("update status of %s: %v", name, err)
	}
}

// complete plays a finished rollout of the Deployment's current spec.
func (f *fixture) complete(name string) {
	f.t.Helper()
	f.setStatus(name, func(dep *appsv1.Deployment) {
		n := *dep.Spec.Replicas
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()},
			},
		}
	})
}

// rolling plays a rollout in progress: one surge pod of the new template is up but
// not ready, the old pods still serve.
func (f *fixture) rolling(name string) {
	f.t.Helper()
	f.setStatus(name, func(dep *appsv1.Deployment) {
		n := *dep.Spec.Replicas
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           n + 1, UpdatedReplicas: 1, ReadyReplicas: n, AvailableReplicas: n,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()},
			},
		}
	})
}

// servingRelease1 syncs release 1 of procs (image A), has its web Deployment
// complete its rollout as the Deployment controller would, and syncs again, so
// that release 1 serves.
func (f *fixture) servingRelease1(procs map[string]appv1.ProcessSpec) {
	f.t.Helper()
	f.sync(f.desired(1, imageA, procs))
	f.complete("hello-web")
	f.sync(f.desired(1, imageA, procs))
}

func envByName(env []corev1.EnvVar) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range env {
		m[e.Name] = e
	}
	return m
}

func TestSyncCreatesDeploymentsAndService(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{
		"web":    {Command: []string{"sh", "-c", "exec ./server --port $(PORT)"}, Replicas: 2},
		"worker": {Replicas: 1},
	})
	d.Env = []appv1.EnvVar{
		{Name: "GREETING", Value: "hi $(USER) $HOME"},
		{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: "hello-db", Key: "url"}},
		{Name: "PORT", Value: "9999"},
	}
	d.HealthCheck = &appv1.HealthCheck{Path: "/healthz", BootTimeoutSeconds: 90}
	st := f.sync(d)

	if st.RolledOut || st.Serving != 0 || st.Failure != "" {
		t.Fatalf("status right after creation: %+v", st)
	}
	if st.Processes["web"] != (runtime.ProcessStatus{Desired: 2}) || st.Processes["worker"] != (runtime.ProcessStatus{Desired: 1}) {
		t.Fatalf("process status %+v", st.Processes)
	}
	if !strings.Contains(st.Message, "web 0/2") || !strings.Contains(st.Message, "worker 0/1") {
		t.Fatalf("message %q", st.Message)
	}

	for _, p := range []string{"web", "worker"} {
		dep := f.deployment("hello-" + p)
		if dep.Labels[kube.LabelApp] != "hello" || dep.Labels[kube.LabelProcess] != p {
			t.Errorf("%s labels %v", p, dep.Labels)
		}
		sel := dep.Spec.Selector.MatchLabels
		if len(sel) != 2 || sel[kube.LabelApp] != "hello" || sel[kube.LabelProcess] != p {
			t.Errorf("%s selector %v", p, sel)
		}
		tl := dep.Spec.Template.Labels
		if tl[kube.LabelApp] != "hello" || tl[kube.LabelProcess] != p || tl[kube.LabelRelease] != "1" {
			t.Errorf("%s template labels %v", p, tl)
		}
		refs := dep.OwnerReferences
		if len(refs) != 1 || refs[0].UID != f.app.UID || refs[0].Kind != "App" || refs[0].APIVersion != "app.bex.co/v1alpha1" ||
			refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%s owner references %+v", p, refs)
		}
		s := dep.Spec.Strategy
		if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil ||
			*s.RollingUpdate.MaxUnavailable != intstr.FromInt32(0) || *s.RollingUpdate.MaxSurge != intstr.FromInt32(1) {
			t.Errorf("%s strategy %+v", p, s)
		}
		if dep.Spec.ProgressDeadlineSeconds == nil || *dep.Spec.ProgressDeadlineSeconds != 90 {
			t.Errorf("%s progress deadline %v, want the boot timeout 90", p, dep.Spec.ProgressDeadlineSeconds)
		}
		pod := dep.Spec.Template.Spec
		if len(pod.Containers) != 1 {
			t.Fatalf("%s containers %+v", p, pod.Containers)
		}
		c := pod.Containers[0]
		if c.Image != imageA {
			t.Errorf("%s image %q", p, c.Image)
		}
		env := envByName(c.Env)
		if c.Env[0].Name != "PORT" || env["PORT"].Value != "8080" || len(c.Env) != 3 {
			t.Errorf("%s env %+v: want PORT=8080 first and the config's PORT left out", p, c.Env)
		}
		// Kubernetes would expand $(USER) and turn $$ into $; the literal survives.
		if env["GREETING"].Value != "hi $$(USER) $$HOME" {
			t.Errorf("%s GREETING %q", p, env["GREETING"].Value)
		}
		if ref := env["DATABASE_URL"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "hello-db" || ref.SecretKeyRef.Key != "url" {
			t.Errorf("%s DATABASE_URL %+v", p, env["DATABASE_URL"])
		}
		if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
			t.Errorf("%s service links / token %v %v", p, pod.EnableServiceLinks, pod.AutomountServiceAccountToken)
		}
	}

	web := f.deployment("hello-web")
	if *web.Spec.Replicas != 2 || *f.deployment("hello-worker").Spec.Replicas != 1 {
		t.Errorf("replicas %d, %d", *web.Spec.Replicas, *f.deployment("hello-worker").Spec.Replicas)
	}
	c := web.Spec.Template.Spec.Containers[0]
	// The command passes through unchanged, $(PORT) included: Kubernetes expands it.
	if !slices.Equal(c.Command, []string{"sh", "-c", "exec ./server --port $(PORT)"}) || c.Args != nil {
		t.Errorf("web command %q args %q", c.Command, c.Args)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != intstr.FromInt32(8080) ||
		p.PeriodSeconds != 2 || p.InitialDelaySeconds != 1 {
		t.Errorf("web readiness probe %+v", c.ReadinessProbe)
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("web ports %+v", c.Ports)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 5 {
		t.Errorf("web preStop %+v", c.Lifecycle)
	}
	worker := f.deployment("hello-worker").Spec.Template.Spec.Containers[0]
	// An empty command keeps the image's entrypoint and command.
	if worker.Command != nil || worker.Args != nil || worker.ReadinessProbe != nil || len(worker.Ports) != 0 || worker.Lifecycle != nil {
		t.Errorf("worker container %+v", worker)
	}

	svc := f.service()
	if svc.Labels[kube.LabelApp] != "hello" || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].UID != f.app.UID {
		t.Errorf("service meta %+v", svc.ObjectMeta)
	}
	if sel := svc.Spec.Selector; len(sel) != 2 || sel[kube.LabelApp] != "hello" || sel[kube.LabelProcess] != "web" {
		t.Errorf("service selector %v", sel)
	}
	if ports := svc.Spec.Ports; len(ports) != 1 || ports[0].Port != 80 || ports[0].TargetPort != intstr.FromInt32(8080) || ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("service ports %+v", ports)
	}
}

// TestAServiceOfAnotherIsNotTakenOver: an app named as another object's
// Service (a database's <db>-rw, here "hello") does not take its selector
// over, which would lead the database's clients, passwords and all, to the
// app's pods.
func TestAServiceOfAnotherIsNotTakenOver(t *testing.T) {
	f := setup(t)
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "hello",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: appv1.GroupVersion.String(), Kind: "Database", Name: "hel", UID: "db-uid", Controller: ptr.To(true)}}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"cnpg.io/cluster": "hel"}, Ports: []corev1.ServicePort{{Port: 5432}}}}
	if err := f.c.Create(f.ctx, theirs); err != nil {
		t.Fatal(err)
	}
	_, err := f.rt.Sync(f.ctx, f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}}))
	if err == nil || !strings.Contains(err.Error(), "the Service hello belongs to something else") {
		t.Fatalf("Sync over another's Service: %v", err)
	}
	if sel := f.service().Spec.Selector; len(sel) != 1 || sel["cnpg.io/cluster"] != "hel" {
		t.Fatalf("the Service's selector became %v", sel)
	}
}

func TestTCPProbeWithoutHealthCheck(t *testing.T) {
	f := setup(t)
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}}))
	dep := f.deployment("hello-web")
	p := dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	if p == nil || p.HTTPGet != nil || p.TCPSocket == nil || p.TCPSocket.Port != intstr.FromInt32(8080) {
		t.Fatalf("probe %+v", p)
	}
	if *dep.Spec.ProgressDeadlineSeconds != appv1.DefaultBootTimeoutSeconds {
		t.Fatalf("progress deadline %d, want the default boot timeout", *dep.Spec.ProgressDeadlineSeconds)
	}
}

func TestSyncWithoutChangeDoesNotWrite(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2, Command: []string{"./server"}}, "worker": {Replicas: 1}})
	d.Env = []appv1.EnvVar{{Name: "A", Value: "1"}, {Name: "S", ValueFrom: &appv1.SecretKeySelector{Name: "s", Key: "k"}}}
	d.HealthCheck = &appv1.HealthCheck{Path: "/up"}
	f.sync(d)
	versions := func() []string {
		return []string{f.deployment("hello-web").ResourceVersion, f.deployment("hello-worker").ResourceVersion, f.service().ResourceVersion}
	}
	before := versions()
	f.sync(d)
	if after := versions(); !slices.Equal(before, after) {
		t.Fatalf("an unchanged Sync wrote: resourceVersions %v → %v", before, after)
	}

	// Once the rollout completes, one Sync records the serving release (a write of
	// the label), and the next is quiet again.
	f.complete("hello-web")
	f.complete("hello-worker")
	if st := f.sync(d); !st.RolledOut || st.Serving != 1 {
		t.Fatalf("status %+v", st)
	}
	before = versions()
	if st := f.sync(d); !st.RolledOut || st.Serving != 1 {
		t.Fatalf("status %+v", st)
	}
	if after := versions(); !slices.Equal(before, after) {
		t.Fatalf("an unchanged Sync after the rollout wrote: resourceVersions %v → %v", before, after)
	}
}

func TestNewReleaseRollsOutWhenTheDeploymentIsComplete(t *testing.T) {
	f := setup(t)
	procs := map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 1}}
	f.sync(f.desired(1, imageA, procs))
	f.complete("hello-web")
	f.complete("hello-worker")
	st := f.sync(f.desired(1, imageA, procs))
	if !st.RolledOut || st.Serving != 1 || st.Message != "" || st.Processes["web"] != (runtime.ProcessStatus{Desired: 2, Ready: 2}) {
		t.Fatalf("release 1 complete: %+v", st)
	}
	if a := f.deployment("hello-web").Labels[kube.LabelServingRelease]; a != "1" {
		t.Fatalf("serving label %q", a)
	}
	gen := f.deployment("hello-web").Generation

	// Release 2: a new image. The template changes; nothing is rolled out until the
	// Deployment controller (here: the test) reports the new pods.
	st = f.sync(f.desired(2, imageB, procs))
	if st.RolledOut || st.Serving != 1 || st.Failure != "" {
		t.Fatalf("release 2 just applied: %+v", st)
	}
	web := f.deployment("hello-web")
	if web.Generation == gen || web.Spec.Template.Labels[kube.LabelRelease] != "2" || web.Spec.Template.Spec.Containers[0].Image != imageB {
		t.Fatalf("web not updated: generation %d→%d, template %v", gen, web.Generation, web.Spec.Template.Labels)
	}
	if web.Labels[kube.LabelServingRelease] != "1" {
		t.Fatalf("serving label %q during the rollout", web.Labels[kube.LabelServingRelease])
	}

	f.rolling("hello-web")
	f.complete("hello-worker")
	st = f.sync(f.desired(2, imageB, procs))
	if st.RolledOut || st.Serving != 1 || st.Processes["worker"].Ready != 1 || st.Processes["web"].Ready != 0 {
		t.Fatalf("release 2 rolling: %+v", st)
	}
	if !strings.Contains(st.Message, "web 0/2") {
		t.Fatalf("message %q", st.Message)
	}

	f.complete("hello-web")
	st = f.sync(f.desired(2, imageB, procs))
	if !st.RolledOut || st.Serving != 2 || st.Processes["web"].Ready != 2 {
		t.Fatalf("release 2 complete: %+v", st)
	}
	if a := f.deployment("hello-web").Labels[kube.LabelServingRelease]; a != "2" {
		t.Fatalf("serving label %q after the rollout", a)
	}
}

func TestScaleChange(t *testing.T) {
	f := setup(t)
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}}))
	f.complete("hello-web")
	f.complete("hello-worker")
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}}))

	before := f.deployment("hello-web").Spec.Template
	st := f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 3}, "worker": {Replicas: 0}}))
	web, worker := f.deployment("hello-web"), f.deployment("hello-worker")
	// Scaling changes no pod template (it would restart every instance): the
	// instances' spread over the nodes is in it at any count, by node, soft,
	// per rollout.
	if !equality.Semantic.DeepEqual(before, web.Spec.Template) {
		t.Errorf("scaling changed the pod template:\n%+v\n%+v", before, web.Spec.Template)
	}
	if ts := web.Spec.Template.Spec.TopologySpreadConstraints; len(ts) != 1 || ts[0].TopologyKey != corev1.LabelHostname || ts[0].MaxSkew != 1 ||
		ts[0].WhenUnsatisfiable != corev1.ScheduleAnyway || ts[0].LabelSelector.MatchLabels[kube.LabelProcess] != "web" ||
		!slices.Equal(ts[0].MatchLabelKeys, []string{appsv1.DefaultDeploymentUniqueLabelKey}) {
		t.Errorf("web's spread over the nodes: %+v", ts)
	}
	if *web.Spec.Replicas != 3 || *worker.Spec.Replicas != 0 || web.Spec.Template.Labels[kube.LabelRelease] != "1" {
		t.Fatalf("replicas %d, %d; template %v", *web.Spec.Replicas, *worker.Spec.Replicas, web.Spec.Template.Labels)
	}
	// The same release keeps serving while the new instances start.
	if st.RolledOut || st.Serving != 1 || st.Processes["web"].Desired != 3 || st.Processes["worker"].Desired != 0 {
		t.Fatalf("scaling: %+v", st)
	}
	f.complete("hello-web")
	f.complete("hello-worker")
	if st := f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 3}, "worker": {Replicas: 0}})); !st.RolledOut || st.Serving != 1 ||
		st.Processes["web"] != (runtime.ProcessStatus{Desired: 3, Ready: 3}) {
		t.Fatalf("scaled: %+v", st)
	}
}

func TestSyncTakesBackFieldsChangedByOthers(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 2}})
	f.sync(d)
	// Someone runs `kubectl scale` (another field manager): the App is the truth.
	web := f.deployment("hello-web")
	web.Spec.Replicas = new(int32(5))
	if err := f.c.Update(f.ctx, web, client.FieldOwner("kubectl")); err != nil {
		t.Fatal(err)
	}
	f.sync(d)
	if n := *f.deployment("hello-web").Spec.Replicas; n != 2 {
		t.Fatalf("replicas %d after Sync, want 2", n)
	}
}

func TestRemovedProcessTypeIsDeleted(t *testing.T) {
	f := setup(t)
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}, "clock": {Replicas: 1}}))
	st := f.sync(f.desired(2, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "clock": {Replicas: 1}}))
	if !f.gone(&appsv1.Deployment{}, "hello-worker") {
		t.Fatal("the worker Deployment is still there")
	}
	if _, ok := st.Processes["worker"]; ok {
		t.Fatalf("worker reported: %+v", st.Processes)
	}
	f.deployment("hello-web")
	f.deployment("hello-clock")

	// Without a web process there is no Service.
	f.sync(f.desired(3, imageA, map[string]appv1.ProcessSpec{"clock": {Replicas: 1}}))
	if !f.gone(&appsv1.Deployment{}, "hello-web") || !f.gone(&corev1.Service{}, "hello") {
		t.Fatal("web Deployment or Service left after web was removed")
	}
}

func TestSuspendedScalesEveryProcessToZero(t *testing.T) {
	f := setup(t)
	procs := map[string]appv1.ProcessSpec{"web": {Replicas: 2}, "worker": {Replicas: 3}}
	f.sync(f.desired(1, imageA, procs))
	f.complete("hello-web")
	f.complete("hello-worker")
	d := f.desired(1, imageA, procs)
	d.Suspended = true
	st := f.sync(d)
	for _, name := range []string{"hello-web", "hello-worker"} {
		dep := f.deployment(name)
		if *dep.Spec.Replicas != 0 {
			t.Fatalf("%s replicas %d while suspended", name, *dep.Spec.Replicas)
		}
	}
	if st.RolledOut || st.Processes["web"].Desired != 0 || st.Processes["worker"].Desired != 0 {
		t.Fatalf("suspending: %+v", st)
	}
	// The Service stays: its endpoints are simply empty.
	f.service()
	f.complete("hello-web")
	f.complete("hello-worker")
	// Suspended and stopped: rolled out, and no release serves.
	if st := f.sync(d); !st.RolledOut || st.Serving != 0 {
		t.Fatalf("suspended: %+v", st)
	}

	d.Suspended = false
	f.sync(d)
	if *f.deployment("hello-web").Spec.Replicas != 2 || *f.deployment("hello-worker").Spec.Replicas != 3 {
		t.Fatal("resuming did not bring the replicas back")
	}
}

func TestProgressDeadlineExceededIsAFailure(t *testing.T) {
	f := setup(t)
	procs := map[string]appv1.ProcessSpec{"web": {Replicas: 2}}
	f.servingRelease1(procs)

	d := f.desired(2, imageB, procs)
	d.HealthCheck = &appv1.HealthCheck{Path: "/healthz", BootTimeoutSeconds: 30}
	f.sync(d)
	f.setStatus("hello-web", func(dep *appsv1.Deployment) {
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           3, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded",
					Message: `ReplicaSet "hello-web-abc" has timed out progressing.`, LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()},
			},
		}
	})
	st := f.sync(d)
	if st.Failure != appv1.HealthCheckFailedReason || st.RolledOut || st.Serving != 1 {
		t.Fatalf("status %+v", st)
	}
	for _, want := range []string{"web process", "release 2", "GET /healthz", "30s", "0 of 2"} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("message %q does not say %q", st.Message, want)
		}
	}

	// A fixed release (3) starts a new rollout: the old failure is not reported for it.
	d = f.desired(3, imageA, procs)
	if st := f.sync(d); st.Failure != "" || st.Serving != 1 {
		t.Fatalf("next release: %+v", st)
	}
}

func TestDeleteRemovesEverythingAndIsIdempotent(t *testing.T) {
	f := setup(t)
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}}))
	// Another app's objects in the namespace stay.
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.ns}}
	if err := f.c.Create(f.ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := f.rt.Sync(f.ctx, runtime.Desired{App: other, Release: 1, Image: imageA, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}); err != nil {
		t.Fatal(err)
	}

	key := client.ObjectKey{Namespace: f.ns, Name: "hello"}
	if err := f.rt.Delete(f.ctx, key); err != nil {
		t.Fatal(err)
	}
	var deps appsv1.DeploymentList
	if err := f.c.List(f.ctx, &deps, client.InNamespace(f.ns), client.MatchingLabels{kube.LabelApp: "hello"}); err != nil {
		t.Fatal(err)
	}
	if len(deps.Items) != 0 {
		t.Fatalf("deployments left: %d", len(deps.Items))
	}
	if !f.gone(&corev1.Service{}, "hello") {
		t.Fatal("service left")
	}
	if err := f.rt.Delete(f.ctx, key); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if err := f.rt.Delete(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "never-synced"}); err != nil {
		t.Fatalf("Delete of an app with nothing: %v", err)
	}
	if f.gone(&appsv1.Deployment{}, "other-web") || f.gone(&corev1.Service{}, "other") {
		t.Fatal("Delete removed another app's objects")
	}
}

func TestSyncNeedsTheAppFromTheAPIServer(t *testing.T) {
	f := setup(t)
	noUID := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: f.ns}}
	_, err := f.rt.Sync(f.ctx, runtime.Desired{App: noUID, Release: 1, Image: imageA, Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}})
	if err == nil || !strings.Contains(err.Error(), "UID") {
		t.Fatalf("Sync without a UID: %v", err)
	}
	if _, err := f.rt.Sync(f.ctx, f.desired(1, "", nil)); err == nil {
		t.Fatal("Sync without an image succeeded")
	}
}

func TestDeploymentNameCollisionIsRefused(t *testing.T) {
	f := setup(t)
	// App "hello" has a process "web-api": its Deployment is hello-web-api.
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{"web-api": {Replicas: 1}}))
	// App "hello-web" with a process "api" would want the same name.
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello-web", Namespace: f.ns}}
	if err := f.c.Create(f.ctx, other); err != nil {
		t.Fatal(err)
	}
	_, err := f.rt.Sync(f.ctx, runtime.Desired{App: other, Release: 1, Image: imageA, Processes: map[string]appv1.ProcessSpec{"api": {Replicas: 1}}})
	if err == nil || !strings.Contains(err.Error(), "already belongs to app hello; rename the process type or the app") {
		t.Fatalf("Sync of a colliding process: %v", err)
	}
	if dep := f.deployment("hello-web-api"); dep.Labels[kube.LabelApp] != "hello" {
		t.Fatalf("the other app's Deployment was taken over: %v", dep.Labels)
	}
}

// ps:restart is a pod-template annotation on the restarted type's Deployment only,
// which makes the Deployment controller roll its pods (kubectl rollout restart).
func TestRestartAnnotatesThePodTemplate(t *testing.T) {
	f := setup(t)
	d := f.desired(1, imageA, map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}})
	f.sync(d)
	webGen, workerGen := f.deployment("hello-web").Generation, f.deployment("hello-worker").Generation
	if a := f.deployment("hello-web").Spec.Template.Annotations; len(a) != 0 {
		t.Fatalf("annotations before a restart: %v", a)
	}
	d.Restarts = map[string]string{"web": "2026-01-01T00:00:00Z/"}
	f.sync(d)
	web, worker := f.deployment("hello-web"), f.deployment("hello-worker")
	if web.Spec.Template.Annotations[appv1.RestartedAtAnnotation] != "2026-01-01T00:00:00Z/" || web.Generation == webGen {
		t.Fatalf("web after the restart: annotations %v, generation %d → %d", web.Spec.Template.Annotations, webGen, web.Generation)
	}
	if worker.Generation != workerGen || len(worker.Spec.Template.Annotations) != 0 {
		t.Fatalf("the worker changed too: %v", worker.Spec.Template.Annotations)
	}
}

// TestCrashLoopingPodIsAFailure: a pod of the new release that the kubelet reports
// in CrashLoopBackOff fails the rollout at once, with the exit it saw; pods of
// other apps and releases are not read into it.
func TestCrashLoopingPodIsAFailure(t *testing.T) {
	f := setup(t)
	procs := map[string]appv1.ProcessSpec{"web": {Replicas: 1}}
	f.servingRelease1(procs)

	d := f.desired(2, imageB, procs)
	if st := f.sync(d); st.Failure != "" {
		t.Fatalf("before any pod: %+v", st)
	}
	// What the ReplicaSet controller and the kubelet would write (envtest runs
	// neither): a pod of release 2 crash-looping, one of release 1 and one of
	// another app restarting too.
	mkPod := func(name, app string, release int, st corev1.ContainerStatus) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: map[string]string{
				kube.LabelApp: app, kube.LabelProcess: "web", kube.LabelRelease: strconv.Itoa(release)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: imageB}}},
		}
		if err := f.c.Create(f.ctx, p); err != nil {
			t.Fatal(err)
		}
		st.Name, st.Image = "web", imageB
		p.Status.ContainerStatuses = []corev1.ContainerStatus{st}
		if err := f.c.Status().Update(f.ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	crashing := corev1.ContainerStatus{RestartCount: 3,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}}}
	mkPod("hello-web-old", "hello", 1, corev1.ContainerStatus{RestartCount: 5, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})
	mkPod("other-web-x", "other", 2, crashing)
	if st := f.sync(d); st.Failure != "" || st.Processes["web"].Restarts != 0 {
		t.Fatalf("with pods of another release and app only: %+v", st)
	}
	mkPod("hello-web-new", "hello", 2, crashing)
	st := f.sync(d)
	if st.Failure != appv1.CrashLoopReason || st.RolledOut || st.Serving != 1 || st.Processes["web"].Restarts != 3 {
		t.Fatalf("status %+v", st)
	}
	for _, want := range []string{"web process of release 2", "hello-web-new keeps exiting", "3 restarts", "exited with code 2"} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("message %q does not say %q", st.Message, want)
		}
	}
}

func TestPodsAreConfinedAndLimited(t *testing.T) {
	f := setup(t)
	two, gig := resource.MustParse("2"), resource.MustParse("1Gi")
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{
		"web":    {Replicas: 1, Resources: &appv1.Resources{Memory: &gig, CPU: &two}},
		"worker": {Replicas: 1},
	}))
	wantCaps := []corev1.Capability{}
	for _, c := range runtime.Capabilities {
		wantCaps = append(wantCaps, corev1.Capability(strings.TrimPrefix(c, "CAP_")))
	}
	for _, tc := range []struct {
		process             string
		memory, cpuReq, cpu string // cpu "" = no limit
	}{
		{"web", "1Gi", "2", "2"},
		{"worker", "512Mi", "100m", ""},
	} {
		dep := f.deployment("hello-" + tc.process)
		pod := dep.Spec.Template.Spec
		if pod.HostUsers == nil || *pod.HostUsers {
			t.Errorf("%s: hostUsers %v, want false", tc.process, pod.HostUsers)
		}
		c := pod.Containers[0]
		r := c.Resources
		if q := r.Limits[corev1.ResourceMemory]; q.Cmp(resource.MustParse(tc.memory)) != 0 {
			t.Errorf("%s: memory limit %s, want %s", tc.process, q.String(), tc.memory)
		}
		if q := r.Requests[corev1.ResourceMemory]; q.Cmp(resource.MustParse(tc.memory)) != 0 {
			t.Errorf("%s: memory request %s, want %s", tc.process, q.String(), tc.memory)
		}
		if q := r.Requests[corev1.ResourceCPU]; q.Cmp(resource.MustParse(tc.cpuReq)) != 0 {
			t.Errorf("%s: cpu request %s, want %s", tc.process, q.String(), tc.cpuReq)
		}
		if q, ok := r.Limits[corev1.ResourceCPU]; tc.cpu == "" && ok || tc.cpu != "" && q.Cmp(resource.MustParse(tc.cpu)) != 0 {
			t.Errorf("%s: cpu limit %v (set %v), want %q", tc.process, q.String(), ok, tc.cpu)
		}
		sc := c.SecurityContext
		if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Fatalf("%s: securityContext %+v, want seccomp RuntimeDefault", tc.process, sc)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged {
			t.Errorf("%s: privilege escalation %v, privileged %v", tc.process, sc.AllowPrivilegeEscalation, sc.Privileged)
		}
		if sc.RunAsNonRoot != nil {
			t.Errorf("%s: runAsNonRoot %v: images run as root in their user namespace", tc.process, *sc.RunAsNonRoot)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, wantCaps) {
			t.Errorf("%s: capabilities %+v", tc.process, sc.Capabilities)
		}
		if slices.Contains(sc.Capabilities.Add, "NET_RAW") || slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") {
			t.Errorf("%s: NET_RAW or SYS_ADMIN added back", tc.process)
		}
	}

	// ps:resources on a running app: the pod template changes, so the Deployment
	// rolls.
	half := resource.MustParse("256Mi")
	f.sync(f.desired(1, imageA, map[string]appv1.ProcessSpec{
		"web":    {Replicas: 1, Resources: &appv1.Resources{Memory: &half}},
		"worker": {Replicas: 1},
	}))
	r := f.deployment("hello-web").Spec.Template.Spec.Containers[0].Resources
	if q := r.Limits[corev1.ResourceMemory]; q.Cmp(half) != 0 {
		t.Errorf("web memory after the change: %s", q.String())
	}
	if _, ok := r.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("web cpu limit after it was unset: %v", r.Limits)
	}
}

func TestHostUsersConfig(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "kube")
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns}}
	if err := cp.Client.Create(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	rt, err := kube.New(kube.Config{HostUsers: true}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Sync(context.Background(), runtime.Desired{App: app, Release: 1, Image: imageA,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}); err != nil {
		t.Fatal(err)
	}
	dep := &appsv1.Deployment{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "hello-web"}, dep); err != nil {
		t.Fatal(err)
	}
	if h := dep.Spec.Template.Spec.HostUsers; h == nil || !*h {
		t.Fatalf("hostUsers %v with HostUsers set, want true", h)
	}
}

// TestVolumeClaimsAndRecreate: a volume is a ReadWriteOnce claim of the
// configured class, owned by the App; the Deployment of each process type that
// mounts it rolls out by Recreate (its rollout message says there is a short
// downtime), the others keep RollingUpdate; a volume taken out of the spec has
// its claim deleted and its Deployment back to RollingUpdate; Delete deletes the
// claims.
func TestVolumeClaimsAndRecreate(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	f := setup(t)
	rt, err := kube.New(kube.Config{VolumeStorageClass: "hcloud-volumes"}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	procs := map[string]appv1.ProcessSpec{"web": {Replicas: 1}, "worker": {Replicas: 1}}
	d := f.desired(1, imageA, procs)
	d.Volumes = []appv1.Volume{{Name: "data", Path: "/data", Size: resource.MustParse("10Gi"), Processes: []string{"web"}}}
	st := f.sync(d)
	if len(st.Volumes) != 1 || st.Volumes[0] != (appv1.VolumeStatus{Name: "data", Ready: true}) {
		t.Fatalf("status.volumes %+v", st.Volumes)
	}
	if !strings.Contains(st.Note, "web stop before their new instances start") || !strings.Contains(st.Note, "short downtime") {
		t.Fatalf("rollout note %q", st.Note)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: kube.VolumeClaimName("hello", "data")}, pvc); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) ||
		pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "hcloud-volumes" ||
		!pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("10Gi")) ||
		len(pvc.OwnerReferences) != 1 || pvc.OwnerReferences[0].UID != f.app.UID || pvc.Labels[kube.LabelVolume] != "data" {
		t.Fatalf("claim %+v", pvc)
	}
	web := f.deployment("hello-web")
	if web.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || web.Spec.Strategy.RollingUpdate != nil {
		t.Fatalf("web's strategy %+v, want Recreate", web.Spec.Strategy)
	}
	pod := web.Spec.Template.Spec
	if len(pod.Volumes) != 1 || pod.Volumes[0].PersistentVolumeClaim == nil || pod.Volumes[0].PersistentVolumeClaim.ClaimName != pvc.Name ||
		len(pod.Containers[0].VolumeMounts) != 1 || pod.Containers[0].VolumeMounts[0].MountPath != "/data" || pod.Containers[0].VolumeMounts[0].Name != pod.Volumes[0].Name {
		t.Fatalf("web's pod: volumes %+v, mounts %+v", pod.Volumes, pod.Containers[0].VolumeMounts)
	}
	worker := f.deployment("hello-worker")
	if worker.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || len(worker.Spec.Template.Spec.Volumes) != 0 {
		t.Fatalf("worker: strategy %+v, volumes %+v", worker.Spec.Strategy, worker.Spec.Template.Spec.Volumes)
	}

	// Out of the spec: the claim is deleted (the API server's pvc-protection
	// keeps it while pods use it: here, with no controller, for good) and
	// reported as being deleted; web rolls again as before.
	d.Volumes = nil
	st = f.sync(d)
	if len(st.Volumes) != 1 || st.Volumes[0].Ready || !strings.Contains(st.Volumes[0].Message, "being deleted") {
		t.Fatalf("status.volumes after removal %+v", st.Volumes)
	}
	if err := f.c.Get(f.ctx, client.ObjectKeyFromObject(pvc), pvc); err == nil && pvc.DeletionTimestamp == nil {
		t.Fatalf("the claim is not being deleted")
	}
	web = f.deployment("hello-web")
	if web.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || len(web.Spec.Template.Spec.Volumes) != 0 {
		t.Fatalf("web after removal: strategy %+v, volumes %+v", web.Spec.Strategy, web.Spec.Template.Spec.Volumes)
	}

	// Delete deletes the claims of the app (another volume, made again).
	d.Volumes = []appv1.Volume{{Name: "other", Path: "/other", Size: resource.MustParse("1Gi")}}
	f.sync(d)
	if err := f.rt.Delete(f.ctx, client.ObjectKeyFromObject(f.app)); err != nil {
		t.Fatal(err)
	}
	other := &corev1.PersistentVolumeClaim{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: kube.VolumeClaimName("hello", "other")}, other); err == nil && other.DeletionTimestamp == nil {
		t.Fatalf("Delete left the claim %s", other.Name)
	}
}
