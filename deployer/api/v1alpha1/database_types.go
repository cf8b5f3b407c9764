package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Database is a managed Postgres or Redis that apps link to. On one machine it
// runs as a confined container with its data on a volume of its own; on a
// cluster as a CloudNativePG Cluster (Postgres) or a StatefulSet (Redis). Its
// credentials live in the Secret CredentialsSecret names; an App links to it
// with a config var whose value comes from that Secret (LinkEnv), so that the
// value is never copied into an App or a Release.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=db
// +kubebuilder:printcolumn:name="Engine",type="string",JSONPath=".spec.engine"
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".status.version"
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="Size",type="string",JSONPath=".spec.size"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name: a database name is 1 to 40 lower-case letters, digits and '-', starting and ending with a letter or digit"
type Database struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what database to run.
	// +required
	Spec DatabaseSpec `json:"spec"`

	// status is what runs.
	// +optional
	Status DatabaseStatus `json:"status,omitempty"`
}

// DatabaseEngine is the kind of database.
// +kubebuilder:validation:Enum=postgres;redis
type DatabaseEngine string

// The engines.
const (
	EnginePostgres DatabaseEngine = "postgres"
	EngineRedis    DatabaseEngine = "redis"
)

// Engines are the engines, in the order the commands list them.
var Engines = []DatabaseEngine{EnginePostgres, EngineRedis}

// DefaultDatabaseSize is the disk of a database made without a size; the
// bounds are those of an app's volume (MinVolumeSize..MaxVolumeSize).
const DefaultDatabaseSize = 1 << 30

// DefaultDatabaseMemory is the memory limit of a database made without one.
const DefaultDatabaseMemory = 256 << 20

// DatabaseSpec is a database's engine, version, disk and who may use it.
// +kubebuilder:validation:XValidation:rule="self.engine == oldSelf.engine",message="engine: a database's engine cannot change"
// +kubebuilder:validation:XValidation:rule="quantity(string(self.size)).compareTo(quantity('16Mi')) >= 0",message="size: a database's size goes from 16Mi to 16Ti"
// +kubebuilder:validation:XValidation:rule="quantity(string(self.size)).compareTo(quantity('16Ti')) <= 0",message="size: a database's size goes from 16Mi to 16Ti"
type DatabaseSpec struct {
	// engine is postgres or redis. It cannot change.
	Engine DatabaseEngine `json:"engine"`

	// version is the engine's major version (e.g. "15", "7"); empty is the
	// version of the image the platform runs (status.version says which).
	// +optional
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)*$`
	Version string `json:"version,omitempty"`

	// size is the disk of the database's data (e.g. 10Gi). On one machine it is
	// fixed when the volume is made.
	// +kubebuilder:validation:XIntOrString
	Size resource.Quantity `json:"size"`

	// resources bound the database's memory and CPU, as a process type's do.
	// +optional
	Resources *Resources `json:"resources,omitempty"`

	// instances is how many servers run: 1 on one machine; 1 to 3 on a cluster
	// (the others are replicas that take over when the primary dies).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3
	// +kubebuilder:default=1
	Instances int32 `json:"instances,omitempty"`

	// members are the users who may see, link and use the database besides
	// admins; the creator is one, as for apps.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=63
	Members []string `json:"members,omitempty"`

	// backups are taken on a schedule and kept on the server (Postgres).
	// +optional
	Backups *DatabaseBackups `json:"backups,omitempty"`
}

// DatabaseBackups is when backups are taken and how many are kept.
type DatabaseBackups struct {
	// schedule is a cron expression (five fields, UTC); default "@daily".
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Schedule string `json:"schedule,omitempty"`

	// keep is how many scheduled and captured backups are kept; default 7.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Keep int32 `json:"keep,omitempty"`
}

// DatabasePhase is a database's state, for people.
// +kubebuilder:validation:Enum=Pending;Creating;Running;Failed;Deleting
type DatabasePhase string

// The phases.
const (
	DatabasePending  DatabasePhase = "Pending"
	DatabaseCreating DatabasePhase = "Creating"
	DatabaseRunning  DatabasePhase = "Running"
	DatabaseFailed   DatabasePhase = "Failed"
	DatabaseDeleting DatabasePhase = "Deleting"
)

// DatabaseStatus is what runs.
type DatabaseStatus struct {
	// phase is Pending, Creating, Running, Failed or Deleting.
	// +optional
	Phase DatabasePhase `json:"phase,omitempty"`

	// conditions: Ready (accepting connections).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// host and port are where linked apps reach the database (the address in
	// the credentials' URL).
	// +optional
	Host string `json:"host,omitempty"`
	// +optional
	Port int32 `json:"port,omitempty"`

	// version is the version that runs.
	// +optional
	Version string `json:"version,omitempty"`

	// image is the image the database's server runs; its tools (psql, pg_dump,
	// redis-cli) run from it too.
	// +optional
	Image string `json:"image,omitempty"`

	// usedBytes is the disk its data takes.
	// +optional
	UsedBytes int64 `json:"usedBytes,omitempty"`

	// links are the apps whose config has a variable from the credentials.
	// +optional
	// +listType=set
	Links []string `json:"links,omitempty"`

	// observedGeneration is the spec's generation the status reports on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// DatabaseList is a list of Databases.
//
// +kubebuilder:object:root=true
type DatabaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Database `json:"items"`
}

// LabelDatabase marks the credentials Secret of a database, with the
// database's name: the runtimes give an instance whose config takes a value
// from such a Secret the reach of that database (and of no other).
const LabelDatabase = "app.bex.co/database"

// The keys of a database's credentials Secret.
const (
	CredentialURL      = "url"      // postgres://user:password@host:port/database, redis://default:password@host:port
	CredentialHost     = "host"     // where linked instances reach it
	CredentialPort     = "port"     // its port there, decimal
	CredentialUser     = "user"     // Postgres's user
	CredentialPassword = "password" // the password
	CredentialDatabase = "database" // Postgres's database
)

// CredentialsSecret is the name of the Secret that holds the credentials of
// the database named name (in the database's namespace). The "bex-db-" prefix
// is no app's (a Secret an app's webhook uses lives elsewhere).
func CredentialsSecret(name string) string { return "bex-db-" + name }

// DatabaseOfSecret is the database whose credentials Secret is named secret.
func DatabaseOfSecret(secret string) (string, bool) {
	name, ok := strings.CutPrefix(secret, "bex-db-")
	return name, ok && ValidDatabaseName(name)
}

// LinkEnv is the default name of the config var a link adds: DATABASE_URL for
// Postgres, REDIS_URL for Redis.
func LinkEnv(e DatabaseEngine) string {
	if e == EngineRedis {
		return "REDIS_URL"
	}
	return "DATABASE_URL"
}

// RuntimeName is the name the runtimes run the database under, as if it were
// an app: "<name>.db", which no App can have (an app's name has no dot), so its
// containers, volume and logs never mix with an app's.
func RuntimeName(name string) string { return name + ".db" }

// RuntimeKey is the database's key in the runtime (RuntimeName).
func (d *Database) RuntimeKey() types.NamespacedName {
	return types.NamespacedName{Namespace: d.Namespace, Name: RuntimeName(d.Name)}
}

// DatabaseRule says what a database name may be, for messages.
const DatabaseRule = AppNameRule

// ValidDatabaseName reports whether name can be a database's name: an app
// name's rule.
func ValidDatabaseName(name string) bool { return ValidAppName(name) }

// CheckDatabaseName returns an error that says the rule when name cannot be a
// database's.
func CheckDatabaseName(name string) error {
	if !ValidDatabaseName(name) {
		return fmt.Errorf("%q is not a database name: use %s", name, DatabaseRule)
	}
	return nil
}

// PostgresName is the user and the database a Postgres database named name
// is made with: its name with '_' for '-'.
func PostgresName(name string) string { return strings.ReplaceAll(name, "-", "_") }

// MemberOf reports whether user is listed in the database's members.
func (d *Database) MemberOf(user string) bool { return slices.Contains(d.Spec.Members, user) }

// LinkedDatabases are the databases env takes values from (valueFrom a
// CredentialsSecret), sorted, without repeats.
func LinkedDatabases(env []EnvVar) []string {
	var out []string
	for _, e := range env {
		if e.ValueFrom == nil {
			continue
		}
		if name, ok := DatabaseOfSecret(e.ValueFrom.Name); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
