package cluster

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// controlledBy fails unless o's controller is the Database db.
func controlledBy(t *testing.T, o metav1.Object, db *appv1.Database) {
	t.Helper()
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "Database" || ref.Name != db.Name || ref.UID != db.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Fatalf("%s is not controlled by database %s: %+v", o.GetName(), db.Name, o.GetOwnerReferences())
	}
}

// secret reads the credentials Secret of name, once made.
func (e *env) secret(name string) *corev1.Secret {
	e.t.Helper()
	s := &corev1.Secret{}
	e.eventually("the credentials Secret", func() error { return e.get(appv1.CredentialsSecret(name), s) })
	return s
}

func TestPostgresIsACloudNativePGClusterWithTheCredentialsOfItsSecret(t *testing.T) {
	e := start(t, testConfig())
	db := e.create("my-shop", appv1.EnginePostgres, func(d *appv1.Database) {
		d.Spec.Instances = 2
		d.Spec.Size = resource.MustParse("2Gi")
		d.Spec.Resources = &appv1.Resources{Memory: ptr.To(resource.MustParse("512Mi")), CPU: ptr.To(resource.MustParse("500m"))}
	})
	var cl *unstructured.Unstructured
	e.eventually("the Cluster", func() (err error) { cl, err = e.cnpgCluster("my-shop"); return err })
	controlledBy(t, cl, db)
	spec := cl.Object["spec"].(map[string]any)
	str := func(path ...string) string { v, _, _ := unstructured.NestedString(spec, path...); return v }
	num := func(path ...string) int64 { v, _, _ := unstructured.NestedInt64(spec, path...); return v }
	if num("instances") != 2 || str("imageName") != "registry.example/cnpg/postgresql:15" ||
		num("postgresUID") != 26 || num("postgresGID") != 26 ||
		str("storage", "size") != "2Gi" || str("storage", "storageClass") != "fast" ||
		str("resources", "limits", "memory") != "512Mi" || str("resources", "requests", "memory") != "512Mi" ||
		str("resources", "limits", "cpu") != "500m" ||
		str("bootstrap", "initdb", "database") != "my_shop" || str("bootstrap", "initdb", "owner") != "my_shop" ||
		str("bootstrap", "initdb", "secret", "name") != "bex-db-my-shop" {
		t.Fatalf("Cluster spec: %v", spec)
	}
	if su, _, _ := unstructured.NestedBool(spec, "enableSuperuserAccess"); su {
		t.Fatal("the superuser is reachable with a password")
	}

	s := e.secret("my-shop")
	controlledBy(t, s, db)
	pw := string(s.Data["password"])
	u, err := url.Parse(string(s.Data["url"]))
	if err != nil {
		t.Fatal(err)
	}
	host := "my-shop-rw." + e.ns + ".svc"
	if s.Type != corev1.SecretTypeBasicAuth || string(s.Data["username"]) != "my_shop" || string(s.Data["user"]) != "my_shop" ||
		string(s.Data["database"]) != "my_shop" || string(s.Data["host"]) != host || string(s.Data["port"]) != "5432" || len(pw) != 32 ||
		u.Scheme != "postgres" || u.Host != host+":5432" || u.User.Username() != "my_shop" || u.Path != "/my_shop" || u.Query().Encode() != "" {
		t.Fatalf("Secret %s: %v, %q", s.Type, s.Data, u)
	}
	if p, _ := u.User.Password(); p != pw {
		t.Fatalf("the URL's password is not the Secret's")
	}

	got := e.waitPhase("my-shop", appv1.DatabaseCreating, "Starting")
	if got.Status.Host != host || got.Status.Port != 5432 || got.Status.Image != "registry.example/cnpg/postgresql:15" || got.Status.Version != "15" {
		t.Fatalf("status: %+v", got.Status)
	}

	// The operator's part: one instance ready of two.
	cl.Object["status"] = map[string]any{"instances": int64(2), "readyInstances": int64(1), "currentPrimary": "my-shop-1",
		"phase": "Creating a new replica", "pgDataImageInfo": map[string]any{"image": "registry.example/cnpg/postgresql:15", "majorVersion": int64(15)}}
	if err := e.c.Status().Update(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	got = e.waitPhase("my-shop", appv1.DatabaseRunning, "Accepting")
	if c := ready(got); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "1 of 2 instances ready") || !strings.Contains(c.Message, "Creating a new replica") {
		t.Fatalf("Ready: %+v", c)
	}

	// A change of the spec reaches the Cluster; the password stays.
	got.Spec.Instances = 3
	if err := e.c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	e.eventually("3 instances", func() error {
		cl, err := e.cnpgCluster("my-shop")
		if err != nil {
			return err
		}
		if n, _, _ := unstructured.NestedInt64(cl.Object, "spec", "instances"); n != 3 {
			return fmt.Errorf("instances %d", n)
		}
		return nil
	})
	if again := e.secret("my-shop"); string(again.Data["password"]) != pw || again.ResourceVersion != s.ResourceVersion {
		t.Fatal("the Secret changed")
	}

	// A phase CloudNativePG does not leave by itself fails the database.
	cl, _ = e.cnpgCluster("my-shop")
	cl.Object["status"] = map[string]any{"instances": int64(3), "readyInstances": int64(0),
		"phase": "Cluster is unrecoverable and needs manual intervention", "phaseReason": "the primary's data is gone"}
	if err := e.c.Status().Update(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	got = e.waitPhase("my-shop", appv1.DatabaseFailed, ReasonClusterFailed)
	if c := ready(got); !strings.Contains(c.Message, "the primary's data is gone") {
		t.Fatalf("Ready: %+v", c)
	}
}

// markPod plays the kubelet: the pod's container state, and Ready when it
// runs.
func (e *env) markPod(name string, state corev1.ContainerState) {
	e.t.Helper()
	pod := &corev1.Pod{}
	e.eventually("pod "+name, func() error { return e.get(name, pod) })
	isReady := state.Running != nil
	pod.Status.Phase = corev1.PodPending
	cond := corev1.ConditionFalse
	if isReady {
		pod.Status.Phase, cond = corev1.PodRunning, corev1.ConditionTrue
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.Now()}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "redis", Image: pod.Spec.Containers[0].Image, State: state, Ready: isReady}}
	if err := e.c.Status().Update(context.Background(), pod); err != nil {
		e.t.Fatal(err)
	}
}

func TestRedisIsAConfinedStatefulSetWithAClaimAndAService(t *testing.T) {
	e := start(t, testConfig())
	db := e.create("cache", appv1.EngineRedis)
	sts := &appsv1.StatefulSet{}
	e.eventually("the StatefulSet", func() error { return e.get("cache-redis", sts) })
	controlledBy(t, sts, db)
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	if *sts.Spec.Replicas != 1 || sts.Spec.ServiceName != "cache-redis" || c.Image != "registry.example/redis:7" ||
		pod.HostUsers == nil || *pod.HostUsers || *pod.AutomountServiceAccountToken || *pod.EnableServiceLinks ||
		sc == nil || *sc.AllowPrivilegeEscalation || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || slices.Contains(sc.Capabilities.Add, "NET_RAW") ||
		c.Resources.Limits.Memory().Value() != appv1.DefaultDatabaseMemory || c.ReadinessProbe.TCPSocket.Port.IntValue() != 6379 {
		t.Fatalf("pod: %+v", pod)
	}
	if cmd := strings.Join(c.Command, " "); !strings.Contains(cmd, `redis-server --port "$PORT" --requirepass "$REDIS_PASSWORD" --appendonly yes`) {
		t.Fatalf("command %q", cmd)
	}
	env := map[string]corev1.EnvVar{}
	for _, v := range c.Env {
		env[v.Name] = v
	}
	if env["PORT"].Value != "6379" || env["REDIS_PASSWORD"].ValueFrom == nil || *env["REDIS_PASSWORD"].ValueFrom.SecretKeyRef != (corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "bex-db-cache"}, Key: "password"}) {
		t.Fatalf("env: %+v", c.Env)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String() != "1Gi" ||
		*sts.Spec.VolumeClaimTemplates[0].Spec.StorageClassName != "fast" || c.VolumeMounts[0].MountPath != "/data" ||
		sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		t.Fatalf("claim: %+v %+v", sts.Spec.VolumeClaimTemplates, sts.Spec.PersistentVolumeClaimRetentionPolicy)
	}
	svc := &corev1.Service{}
	e.eventually("the Service", func() error { return e.get("cache-redis", svc) })
	controlledBy(t, svc, db)
	if svc.Spec.Ports[0].Port != 6379 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Fatalf("service: %+v", svc.Spec)
	}
	s := e.secret("cache")
	u, err := url.Parse(string(s.Data["url"]))
	if err != nil {
		t.Fatal(err)
	}
	host := "cache-redis." + e.ns + ".svc"
	if p, _ := u.User.Password(); u.Scheme != "redis" || u.Host != host+":6379" || p != string(s.Data["password"]) || s.Data["user"] != nil || s.Type != corev1.SecretTypeOpaque {
		t.Fatalf("Secret %s: %v", s.Type, s.Data)
	}

	// The StatefulSet controller makes the pod; the kubelet's word moves the
	// database.
	got := e.waitPhase("cache", appv1.DatabaseCreating, "Starting")
	if got.Status.Host != host || got.Status.Port != 6379 || got.Status.Version != "7" {
		t.Fatalf("status: %+v", got.Status)
	}
	e.markPod("cache-redis-0", corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "not found"}})
	got = e.waitPhase("cache", appv1.DatabaseFailed, appv1.ImageNotFoundReason)
	if m := ready(got).Message; !strings.Contains(m, "cache-redis-0 cannot pull image registry.example/redis:7") {
		t.Fatalf("message %q", m)
	}
	e.markPod("cache-redis-0", corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
	e.waitPhase("cache", appv1.DatabaseRunning, "Accepting")

	// The disk is fixed when made: a larger size is said, not applied.
	got = e.db("cache")
	got.Spec.Size = resource.MustParse("2Gi")
	if err := e.c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	e.eventually("the size's note", func() error {
		if m := ready(e.db("cache")).Message; !strings.Contains(m, "its disk stays 1Gi") {
			return fmt.Errorf("message %q", m)
		}
		return nil
	})
}

func TestWhatADatabaseCannotBeIsFailedWithOneMessage(t *testing.T) {
	e := start(t, testConfig())
	e.create("twice", appv1.EngineRedis, func(d *appv1.Database) { d.Spec.Instances = 2 })
	got := e.waitPhase("twice", appv1.DatabaseFailed, ReasonTooManyInstances)
	if m := ready(got).Message; m != "Redis runs as one instance: 2 asked for; make it with --instances 1 (replicas are for Postgres)" {
		t.Fatalf("message %q", m)
	}
	// Refused before anything is made.
	if err := e.get("twice-redis", &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a StatefulSet for a refused Redis: %v", err)
	}

	e.create("old", appv1.EnginePostgres, func(d *appv1.Database) { d.Spec.Version = "12" })
	got = e.waitPhase("old", appv1.DatabaseFailed, "VersionUnavailable")
	if m := ready(got).Message; m != "postgres 12 is not offered here: this platform runs postgres 15; create it without --version" {
		t.Fatalf("message %q", m)
	}
	if _, err := e.cnpgCluster("old"); !apierrors.IsNotFound(err) {
		t.Fatalf("a Cluster for a refused Postgres: %v", err)
	}
}

// admits reports whether policy lets a pod with podLabels, in a namespace
// with nsLabels, connect to port of the pods it selects (NetworkPolicy's
// rules: a peer with a pod selector alone is of the policy's namespace).
func admits(t *testing.T, policy *networkingv1.NetworkPolicy, ns string, nsLabels, podLabels map[string]string, port int32) bool {
	t.Helper()
	matches := func(sel *metav1.LabelSelector, l map[string]string) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		return s.Matches(labels.Set(l))
	}
	for _, rule := range policy.Spec.Ingress {
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			portOK = portOK || p.Port.IntVal == port
		}
		if !portOK {
			continue
		}
		for _, peer := range rule.From {
			nsOK := ns == policy.Namespace
			if peer.NamespaceSelector != nil {
				nsOK = matches(peer.NamespaceSelector, nsLabels)
			}
			podOK := peer.PodSelector == nil || matches(peer.PodSelector, podLabels)
			if nsOK && podOK && (peer.PodSelector != nil || peer.NamespaceSelector != nil) {
				return true
			}
		}
	}
	return false
}

func link(ns, name, db string) *appv1.App {
	return &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: appv1.AppSpec{Env: []appv1.EnvVar{
		{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: appv1.CredentialsSecret(db), Key: appv1.CredentialURL}},
	}}}
}

func TestOnlyTheLinkedAppsAndTheDatabasesOwnPodsAreLetIn(t *testing.T) {
	e := start(t, testConfig())
	ctx := context.Background()
	e.create("shop", appv1.EnginePostgres)
	e.create("cache", appv1.EngineRedis)
	web, worker := link(e.ns, "web", "shop"), link(e.ns, "worker", "shop")
	other := &appv1.App{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "other"}}
	for _, a := range []*appv1.App{web, worker, other} {
		if err := e.c.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually("the links", func() error {
		if l := e.db("shop").Status.Links; !slices.Equal(l, []string{"web", "worker"}) {
			return fmt.Errorf("links %v", l)
		}
		return nil
	})

	policy := func(name string) *networkingv1.NetworkPolicy {
		p := &networkingv1.NetworkPolicy{}
		e.eventually("policy "+PolicyName(name), func() error { return e.get(PolicyName(name), p) })
		return p
	}
	ns := map[string]string{corev1.LabelMetadataName: e.ns}
	app := func(name string) map[string]string {
		return map[string]string{appv1.LabelApp: name, appv1.LabelProcess: "web"}
	}
	pg := policy("shop")
	controlledBy(t, pg, e.db("shop"))
	instance := map[string]string{LabelCNPGCluster: "shop", "cnpg.io/instanceRole": "primary"}
	if !labels.SelectorFromSet(pg.Spec.PodSelector.MatchLabels).Matches(labels.Set(instance)) || !slices.Equal(pg.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Fatalf("the policy is not on the Cluster's pods: %+v", pg.Spec)
	}
	operator := map[string]string{corev1.LabelMetadataName: "cnpg-system"}
	for _, c := range []struct {
		what     string
		ns       string
		nsLabels map[string]string
		pod      map[string]string
		port     int32
		want     bool
	}{
		{"a linked app", e.ns, ns, app("web"), 5432, true},
		{"another linked app", e.ns, ns, app("worker"), 5432, true},
		{"the database's one-off (psql)", e.ns, ns, map[string]string{appv1.LabelApp: "shop.db", appv1.LabelOneOff: "x1"}, 5432, true},
		{"a linked app on another port", e.ns, ns, app("web"), 8000, false},
		{"an app that is not linked", e.ns, ns, app("other"), 5432, false},
		{"a pod of no app", e.ns, ns, map[string]string{}, 5432, false},
		{"an app of that name in another namespace", "elsewhere", map[string]string{corev1.LabelMetadataName: "elsewhere"}, app("web"), 5432, false},
		{"another database's one-off", e.ns, ns, map[string]string{appv1.LabelApp: "cache.db"}, 5432, false},
		{"an instance of the Cluster (replication)", e.ns, ns, instance, 5432, true},
		{"CloudNativePG's operator", "cnpg-system", operator, map[string]string{"app.kubernetes.io/name": "cloudnative-pg"}, 8000, true},
	} {
		if got := admits(t, pg, c.ns, c.nsLabels, c.pod, c.port); got != c.want {
			t.Errorf("postgres: %s on port %d: admitted %v, want %v", c.what, c.port, got, c.want)
		}
	}

	// Redis: its own pods' policy, without the operator.
	rp := policy("cache")
	if !labels.SelectorFromSet(rp.Spec.PodSelector.MatchLabels).Matches(labels.Set{appv1.LabelDatabase: "cache"}) ||
		admits(t, rp, e.ns, ns, app("web"), 6379) || !admits(t, rp, e.ns, ns, map[string]string{appv1.LabelApp: "cache.db"}, 6379) ||
		admits(t, rp, "cnpg-system", operator, map[string]string{}, 6379) {
		t.Fatalf("redis policy: %+v", rp.Spec)
	}

	// Unlinked: out of status.links and out of the policy.
	worker.Spec.Env = nil
	if err := e.c.Update(ctx, worker); err != nil {
		t.Fatal(err)
	}
	e.eventually("worker unlinked", func() error {
		if l := e.db("shop").Status.Links; !slices.Equal(l, []string{"web"}) {
			return fmt.Errorf("links %v", l)
		}
		if admits(t, policy("shop"), e.ns, ns, app("worker"), 5432) {
			return fmt.Errorf("the policy still lets worker in")
		}
		return nil
	})
	if !admits(t, policy("shop"), e.ns, ns, app("web"), 5432) {
		t.Fatal("web is out too")
	}
}

func TestDeletingADatabaseTakesEverythingWithIt(t *testing.T) {
	e := start(t, testConfig())
	ctx := context.Background()
	pg := e.create("shop", appv1.EnginePostgres)
	rd := e.create("cache", appv1.EngineRedis)

	// Postgres: what the operator would make is owned by the Cluster.
	var cl *unstructured.Unstructured
	e.eventually("the Cluster", func() (err error) { cl, err = e.cnpgCluster("shop"); return err })
	operatorClaim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "shop-1",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: ClusterGVK.GroupVersion().String(), Kind: ClusterGVK.Kind, Name: cl.GetName(), UID: cl.GetUID(), Controller: ptr.To(true)}}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if err := e.c.Create(ctx, operatorClaim); err != nil {
		t.Fatal(err)
	}
	// Redis: the StatefulSet controller makes the pod and its claim, which the
	// retention policy has the StatefulSet own.
	claim := &corev1.PersistentVolumeClaim{}
	e.eventually("the Redis claim, owned by its StatefulSet", func() error {
		if err := e.get("data-cache-redis-0", claim); err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "StatefulSet" {
			return fmt.Errorf("owners %+v", claim.OwnerReferences)
		}
		return nil
	})
	e.secret("shop")
	e.secret("cache")
	for _, name := range []string{PolicyName("shop"), PolicyName("cache")} {
		e.eventually("policy "+name, func() error { return e.get(name, &networkingv1.NetworkPolicy{}) })
	}
	e.eventually("the Redis Service", func() error { return e.get("cache-redis", &corev1.Service{}) })

	for _, db := range []*appv1.Database{pg, rd} {
		if err := e.c.Delete(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(name string, o client.Object) client.Object { o.SetName(name); return o }
	cluster := &unstructured.Unstructured{}
	cluster.SetGroupVersionKind(ClusterGVK)
	e.gone("postgres", gone("shop", cluster), gone("shop-1", &corev1.PersistentVolumeClaim{}),
		gone("bex-db-shop", &corev1.Secret{}), gone(PolicyName("shop"), &networkingv1.NetworkPolicy{}), gone("shop", &appv1.Database{}))
	e.gone("redis", gone("cache-redis", &appsv1.StatefulSet{}), gone("cache-redis-0", &corev1.Pod{}),
		gone("data-cache-redis-0", &corev1.PersistentVolumeClaim{}), gone("cache-redis", &corev1.Service{}),
		gone("bex-db-cache", &corev1.Secret{}), gone(PolicyName("cache"), &networkingv1.NetworkPolicy{}), gone("cache", &appv1.Database{}))
}

// withoutCNPG is the API server's kinds but CloudNativePG's, as on a cluster
// where it is not installed.
type withoutCNPG struct{ meta.RESTMapper }

func (m withoutCNPG) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	if gk.Group == ClusterGVK.Group {
		return nil, &meta.NoKindMatchError{GroupKind: gk, SearchedVersions: versions}
	}
	return m.RESTMapper.RESTMapping(gk, versions...)
}

func TestWithoutCloudNativePGRedisRunsAndPostgresSaysWhy(t *testing.T) {
	e, r := startWith(t, testConfig(), func(o *ctrl.Options) {
		o.MapperProvider = func(c *rest.Config, hc *http.Client) (meta.RESTMapper, error) {
			m, err := apiutil.NewDynamicRESTMapper(c, hc)
			return withoutCNPG{m}, err
		}
	})
	if r.postgres {
		t.Fatal("the reconciler found a kind that is not served")
	}
	e.create("shop", appv1.EnginePostgres)
	e.create("cache", appv1.EngineRedis)
	got := e.waitPhase("shop", appv1.DatabaseFailed, ReasonNoOperator)
	if m := ready(got).Message; !strings.Contains(m, "Postgres needs CloudNativePG, which this cluster does not run") {
		t.Fatalf("message %q", m)
	}
	e.eventually("the Redis StatefulSet", func() error { return e.get("cache-redis", &appsv1.StatefulSet{}) })
	if _, err := e.cnpgCluster("shop"); !apierrors.IsNotFound(err) {
		t.Fatalf("a Cluster without the operator: %v", err)
	}
}
