package cluster

import (
	"encoding/json"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/databases"
	"bex.co/bex/deployer/runtime/kube"
)

// ClusterGVK is CloudNativePG's Cluster, written as unstructured objects: bex
// does not import CloudNativePG's module (its Kubernetes versions are not
// bex's), only the few fields below.
var ClusterGVK = schema.GroupVersionKind{Group: "postgresql.cnpg.io", Version: "v1", Kind: "Cluster"}

// LabelCNPGCluster is the label CloudNativePG puts on the pods (instances and
// jobs) of a Cluster, with its name.
const LabelCNPGCluster = "cnpg.io/cluster"

// volumeName is the Redis claim template's name, and the container's mount.
const volumeName = "data"

// PostgresHost is where linked apps reach the Postgres database name of
// namespace ns: the read-write Service CloudNativePG makes for the Cluster
// ("<cluster>-rw"), which follows the primary.
func PostgresHost(name, ns string) string { return name + "-rw." + ns + ".svc" }

// RedisName is the name of the StatefulSet and the Service of the Redis
// database name.
func RedisName(name string) string { return name + "-redis" }

// RedisHost is where linked apps reach the Redis database name of namespace ns.
func RedisHost(name, ns string) string { return RedisName(name) + "." + ns + ".svc" }

// PolicyName is the name of the database's NetworkPolicy: its credentials
// Secret's ("bex-db-<name>"), a prefix no app's objects have.
func PolicyName(name string) string { return appv1.CredentialsSecret(name) }

func ownerReference(db *appv1.Database) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(appv1.GroupVersion.String()).
		WithKind("Database").
		WithName(db.Name).
		WithUID(db.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// serverPods selects the pods of db's servers: CloudNativePG's instances and
// jobs (by its label), or the Redis StatefulSet's pods.
func serverPods(db *appv1.Database) map[string]string {
	if db.Spec.Engine == appv1.EngineRedis {
		return map[string]string{appv1.LabelDatabase: db.Name}
	}
	return map[string]string{LabelCNPGCluster: db.Name}
}

// The fields of a Cluster bex writes (postgresql.cnpg.io/v1, CloudNativePG
// 1.27's API).
type clusterSpec struct {
	Instances             int32                                            `json:"instances"`
	ImageName             string                                           `json:"imageName"`
	ImagePullSecrets      []localObjectReference                           `json:"imagePullSecrets,omitempty"`
	PostgresUID           int64                                            `json:"postgresUID"`
	PostgresGID           int64                                            `json:"postgresGID"`
	EnableSuperuserAccess bool                                             `json:"enableSuperuserAccess"`
	Storage               clusterStorage                                   `json:"storage"`
	Resources             *corev1ac.ResourceRequirementsApplyConfiguration `json:"resources"`
	Bootstrap             clusterBootstrap                                 `json:"bootstrap"`
}

type localObjectReference struct {
	Name string `json:"name"`
}

type clusterStorage struct {
	Size         string `json:"size"`
	StorageClass string `json:"storageClass,omitempty"`
}

type clusterBootstrap struct {
	InitDB clusterInitDB `json:"initdb"`
}

type clusterInitDB struct {
	Database string               `json:"database"`
	Owner    string               `json:"owner"`
	Secret   localObjectReference `json:"secret"`
}

// clusterStatus is what bex reads of a Cluster's status.
type clusterStatus struct {
	Instances       int    `json:"instances"`
	ReadyInstances  int    `json:"readyInstances"`
	CurrentPrimary  string `json:"currentPrimary"`
	Phase           string `json:"phase"`
	PhaseReason     string `json:"phaseReason"`
	PGDataImageInfo *struct {
		MajorVersion int `json:"majorVersion"`
	} `json:"pgDataImageInfo"`
}

// The phases of a Cluster after which CloudNativePG does not go on by itself
// (cluster_types.go).
var failedPhases = map[string]bool{
	"Cluster is unrecoverable and needs manual intervention":                                  true,
	"Cluster has incomplete or invalid image catalog":                                         true,
	"Unable to create required cluster objects":                                               true,
	"Cluster cannot proceed to reconciliation due to an unknown plugin being required":        true,
	"Cluster cannot proceed to reconciliation due to an error while interacting with plugins": true,
	"Cluster cannot execute instance online upgrade due to missing architecture binary":       true,
}

// postgresCluster is the Cluster of a Postgres database: its instances, the
// operand image and user, its disk and resources, and a database and owner
// PostgresName(name) made by initdb with the password of the credentials
// Secret. No superuser password: the operator reaches the instances through
// its own certificates.
func postgresCluster(cfg Config, db *appv1.Database) (*unstructured.Unstructured, error) {
	name := appv1.PostgresName(db.Name)
	spec := clusterSpec{
		Instances:   max(db.Spec.Instances, 1),
		ImageName:   cfg.Postgres.Ref,
		PostgresUID: cfg.PostgresUID,
		PostgresGID: cfg.PostgresGID,
		Storage:     clusterStorage{Size: db.Spec.Size.String(), StorageClass: cfg.StorageClass},
		Resources:   kube.Resources(databases.ServerResources(db)),
		Bootstrap: clusterBootstrap{InitDB: clusterInitDB{
			Database: name, Owner: name, Secret: localObjectReference{Name: appv1.CredentialsSecret(db.Name)},
		}},
	}
	if cfg.Pods.ImagePullSecret != "" {
		spec.ImagePullSecrets = []localObjectReference{{Name: cfg.Pods.ImagePullSecret}}
	}
	specMap, err := toMap(spec)
	if err != nil {
		return nil, err
	}
	owner, err := toMap(ownerReference(db))
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": specMap}}
	u.SetGroupVersionKind(ClusterGVK)
	u.SetNamespace(db.Namespace)
	u.SetName(db.Name)
	u.SetLabels(map[string]string{appv1.LabelDatabase: db.Name})
	u.Object["metadata"].(map[string]any)["ownerReferences"] = []any{owner}
	return u, nil
}

// statusOfCluster reads the status of a Cluster.
func statusOfCluster(u *unstructured.Unstructured) (clusterStatus, error) {
	var st clusterStatus
	raw, ok := u.Object["status"]
	if !ok {
		return st, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// toMap is v as JSON's objects.
func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}

// redisStatefulSet is the StatefulSet of a Redis database: one pod confined
// as an app's, running databases.RedisServer on RedisPort with the password
// of the credentials Secret, its data on a claim of size (fixed when the
// StatefulSet is made: a StatefulSet's claim templates cannot change), which
// goes with the StatefulSet (persistentVolumeClaimRetentionPolicy).
func redisStatefulSet(cfg Config, db *appv1.Database, size resource.Quantity) *appsv1ac.StatefulSetApplyConfiguration {
	labels := serverPods(db)
	c := corev1ac.Container().
		WithName(string(appv1.EngineRedis)).
		WithImage(cfg.Redis.Ref).
		// exec: Redis is the container's process, which gets the stop signal.
		WithCommand("sh", "-c", "exec "+databases.RedisServer).
		WithEnv(
			corev1ac.EnvVar().WithName("PORT").WithValue(strconv.Itoa(RedisPort)),
			corev1ac.EnvVar().WithName("REDIS_PASSWORD").WithValueFrom(corev1ac.EnvVarSource().WithSecretKeyRef(
				corev1ac.SecretKeySelector().WithName(appv1.CredentialsSecret(db.Name)).WithKey(appv1.CredentialPassword))),
		).
		WithPorts(corev1ac.ContainerPort().WithName("redis").WithContainerPort(RedisPort).WithProtocol(corev1.ProtocolTCP)).
		WithReadinessProbe(corev1ac.Probe().
			WithTCPSocket(corev1ac.TCPSocketAction().WithPort(intstr.FromInt32(RedisPort))).
			WithPeriodSeconds(2).WithTimeoutSeconds(2).WithFailureThreshold(3)).
		WithResources(kube.Resources(databases.ServerResources(db))).
		WithSecurityContext(kube.ContainerSecurityContext()).
		WithVolumeMounts(corev1ac.VolumeMount().WithName(volumeName).WithMountPath(databases.RedisData))
	pod := kube.PodSpec(cfg.Pods, c).WithTerminationGracePeriodSeconds(kube.DefaultTerminationGracePeriodSeconds)

	claim := corev1ac.PersistentVolumeClaimSpec().
		WithAccessModes(corev1.ReadWriteOnce).
		WithResources(corev1ac.VolumeResourceRequirements().WithRequests(corev1.ResourceList{corev1.ResourceStorage: size}))
	if cfg.StorageClass != "" {
		claim.WithStorageClassName(cfg.StorageClass)
	}
	template := &corev1ac.PersistentVolumeClaimApplyConfiguration{}
	template.WithName(volumeName).WithLabels(labels).WithSpec(claim)

	return appsv1ac.StatefulSet(RedisName(db.Name), db.Namespace).
		WithLabels(labels).
		WithOwnerReferences(ownerReference(db)).
		WithSpec(appsv1ac.StatefulSetSpec().
			WithReplicas(1).
			WithServiceName(RedisName(db.Name)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(labels)).
			WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
				WithWhenDeleted(appsv1.DeletePersistentVolumeClaimRetentionPolicyType).
				WithWhenScaled(appsv1.RetainPersistentVolumeClaimRetentionPolicyType)).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels).WithSpec(pod)).
			WithVolumeClaimTemplates(template))
}

// redisService is the address of a Redis database: RedisPort of its pod.
func redisService(db *appv1.Database) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(RedisName(db.Name), db.Namespace).
		WithLabels(serverPods(db)).
		WithOwnerReferences(ownerReference(db)).
		WithSpec(corev1ac.ServiceSpec().
			WithSelector(serverPods(db)).
			WithPorts(corev1ac.ServicePort().WithName("redis").WithProtocol(corev1.ProtocolTCP).
				WithPort(RedisPort).WithTargetPort(intstr.FromInt32(RedisPort))))
}

// networkPolicy lets into the pods of db's servers only:
//
//   - on the server's port, the pods of the linked apps (their instances,
//     one-offs and cron jobs carry app.bex.co/app) and the database's own
//     one-offs (psql, pg_dump, redis-cli: app.bex.co/app=<name>.db, as the
//     gitserver runs them);
//   - for Postgres, on any port, the Cluster's own pods (replication, and the
//     instance managers between them) and CloudNativePG's operator.
//
// Everything else is dropped where the cluster's network enforces policies.
func networkPolicy(cfg Config, db *appv1.Database, links []string) *networkingv1ac.NetworkPolicyApplyConfiguration {
	port := int32(PostgresPort)
	if db.Spec.Engine == appv1.EngineRedis {
		port = RedisPort
	}
	apps := append([]string{appv1.RuntimeName(db.Name)}, links...)
	rules := []*networkingv1ac.NetworkPolicyIngressRuleApplyConfiguration{
		networkingv1ac.NetworkPolicyIngressRule().
			WithFrom(networkingv1ac.NetworkPolicyPeer().WithPodSelector(metav1ac.LabelSelector().
				WithMatchExpressions(metav1ac.LabelSelectorRequirement().
					WithKey(appv1.LabelApp).WithOperator(metav1.LabelSelectorOpIn).WithValues(apps...)))).
			WithPorts(networkingv1ac.NetworkPolicyPort().WithProtocol(corev1.ProtocolTCP).WithPort(intstr.FromInt32(port))),
	}
	if db.Spec.Engine != appv1.EngineRedis {
		rules = append(rules, networkingv1ac.NetworkPolicyIngressRule().
			WithFrom(
				networkingv1ac.NetworkPolicyPeer().WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(serverPods(db))),
				networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(metav1ac.LabelSelector().
					WithMatchLabels(map[string]string{corev1.LabelMetadataName: cfg.OperatorNamespace})),
			))
	}
	return networkingv1ac.NetworkPolicy(PolicyName(db.Name), db.Namespace).
		WithLabels(map[string]string{appv1.LabelDatabase: db.Name}).
		WithOwnerReferences(ownerReference(db)).
		WithSpec(networkingv1ac.NetworkPolicySpec().
			WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(serverPods(db))).
			WithPolicyTypes(networkingv1.PolicyTypeIngress).
			WithIngress(rules...))
}
