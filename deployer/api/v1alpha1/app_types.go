package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxReplicas is the most instances of one process type. It is a guard against typos
// (`ps:scale web=1000`), not a capacity plan.
const MaxReplicas = 100

// DefaultDeployBranch is the branch whose pushes deploy when an app names none.
const DefaultDeployBranch = "main"

// DefaultBootTimeoutSeconds is how long a new instance may take to pass its health
// check before the release fails (Heroku's R10 boot timeout).
const DefaultBootTimeoutSeconds = 60

// RestartedAtAnnotation on an App restarts its processes, the way
// `kubectl rollout restart` does for a Deployment: set it to the current time
// (RFC3339) to replace every instance of the app; set
// RestartedAtAnnotation+"."+<process> to replace the instances of one process type
// only. The deployer passes the value on to its runtime (RestartToken), which starts
// new instances and stops the old ones once the new are healthy, as in a rollout.
// It is an annotation, not spec: a restart changes nothing of what the app is, so it
// makes no release.
const RestartedAtAnnotation = "app.bex.co/restartedAt"

// RestartToken is what marks the last restart of process: empty when it was never
// restarted, and different after every restart of the app or of that process.
func (a *App) RestartToken(process string) string {
	all, one := a.Annotations[RestartedAtAnnotation], a.Annotations[RestartedAtAnnotation+"."+process]
	if all == "" && one == "" {
		return ""
	}
	return all + "/" + one
}

// App is one deployable application: the desired state (image, processes, config,
// domains) in spec, the truth about what serves in status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=app
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="Revision",type="integer",JSONPath=".status.revision"
// +kubebuilder:printcolumn:name="URL",type="string",JSONPath=".status.url"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name: an app name is a DNS-1123 label of at most 40 characters: lower-case letters, digits and '-', starting and ending with a letter or digit"
type App struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the app.
	// +optional
	Spec AppSpec `json:"spec,omitempty"`

	// status is what the deployer observed. It is written by the deployer only.
	// +optional
	Status AppStatus `json:"status,omitempty"`
}

// AppSpec is the desired state of an App.
type AppSpec struct {
	// image is the digest-pinned image of the current release
	// (for example registry.example/app@sha256:<64 hex>). Empty until the first build.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^@\s]+@sha256:[a-f0-9]{64}$`
	Image string `json:"image,omitempty"`

	// release is the number of the Release this spec rolls out. 0 means none yet.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Release int64 `json:"release,omitempty"`

	// processes are the process types to run, by name (from the Procfile); the "web"
	// process gets the app's route and a PORT to listen on.
	// +optional
	// +kubebuilder:validation:MaxProperties=20
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 30 && k.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",message="process type names are lower-case letters, digits and '-', at most 30 characters, starting with a letter"
	Processes map[string]ProcessSpec `json:"processes,omitempty"`

	// env are the app's config vars, given to every process.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=500
	Env []EnvVar `json:"env,omitempty"`

	// domains are host names served besides the default <app>.<base domain>.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Domains []string `json:"domains,omitempty"`

	// healthCheck says when a new instance is ready for traffic. Without it, an
	// instance is ready once its PORT accepts TCP connections.
	// +optional
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`

	// suspended stops every process of the app; the edge answers 503 meanwhile.
	// Resuming brings back the same release.
	// +optional
	Suspended bool `json:"suspended,omitempty"`

	// git holds the settings of the app's repository.
	// +optional
	Git GitSpec `json:"git,omitempty"`

	// build says how the app's commits are built.
	// +optional
	Build BuildSpec `json:"build,omitempty"`

	// scripts are the commands the repository runs around a release: the Procfile's
	// `release:` and app.json's scripts. They come with the code (the builder reads
	// them from each pushed commit) and are snapshotted in each Release.
	// +optional
	Scripts *Scripts `json:"scripts,omitempty"`

	// cron are the app's scheduled jobs (app.json `cron`), each run as a one-off
	// instance of the serving release. They come with the code, as scripts do.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=50
	Cron []CronJob `json:"cron,omitempty"`

	// members are the names of the Users, besides admins, who may push to the app and
	// manage it. Access lives on the App so that one object answers "who may touch
	// this app", and the grant goes away with the app.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=200
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Members []string `json:"members,omitempty"`

	// volumes are directories that outlive the app's instances, each mounted at
	// its path in the instances of the process types that ask for it and in every
	// one-off (run, release, cron). They are not rolled back with the code: a
	// rollback, a redeploy, a restart, suspend/resume and a restart of bex keep
	// their contents; removing one from this list deletes its data.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(v, self.exists_one(w, w.path == v.path))",message="two volumes cannot have the same path"
	Volumes []Volume `json:"volumes,omitempty"`
}

// MinVolumeSize and MaxVolumeSize bound a volume's size: below 16 MiB an ext4
// file system with a journal does not fit, and 16 TiB is a guard against typos,
// not a capacity plan.
const (
	MinVolumeSize = 16 << 20
	MaxVolumeSize = 16 << 40
)

// DefaultVolumeSize is the size of a volume created without one.
const DefaultVolumeSize = 1 << 30

// MaxVolumes is the most volumes one app may have.
const MaxVolumes = 8

// Volume is one of an app's persistent directories.
// +kubebuilder:validation:XValidation:rule="quantity(string(self.size)).compareTo(quantity('16Mi')) >= 0",message="size: a volume's size goes from 16Mi to 16Ti"
// +kubebuilder:validation:XValidation:rule="quantity(string(self.size)).compareTo(quantity('16Ti')) <= 0",message="size: a volume's size goes from 16Mi to 16Ti"
type Volume struct {
	// name names the volume within its app: lower-case letters, digits and '-'.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=30
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// path is where the volume is mounted in the instances: an absolute, clean
	// path, not / and not under /proc, /sys or /dev.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^(/[A-Za-z0-9_@+-][A-Za-z0-9._@+-]*)+$`
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '.' || s == '..')",message="path: no '.' or '..' segments"
	// +kubebuilder:validation:XValidation:rule="!['/proc', '/sys', '/dev'].exists(p, self == p || self.startsWith(p + '/'))",message="path: not /proc, /sys, /dev or under them"
	Path string `json:"path"`

	// size is the volume's capacity (e.g. 1Gi): writes beyond it fail with
	// ENOSPC inside the app. It is fixed when the volume is made on one machine
	// (status.volumes says so when the spec asks for another); a cluster's claim
	// grows where its StorageClass allows.
	// +kubebuilder:validation:XIntOrString
	Size resource.Quantity `json:"size"`

	// processes are the process types whose instances mount the volume; empty
	// means all of them. One-offs mount every volume of the app.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=20
	// +kubebuilder:validation:items:MaxLength=30
	// +kubebuilder:validation:items:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Processes []string `json:"processes,omitempty"`
}

// MountedIn reports whether the instances of process mount v.
func (v Volume) MountedIn(process string) bool {
	return len(v.Processes) == 0 || slices.Contains(v.Processes, process)
}

// VolumeStatus is what the runtime knows of one volume.
type VolumeStatus struct {
	// name is the volume's name (Volume.name).
	Name string `json:"name"`

	// ready is true once the volume exists and can be mounted.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// message says why it is not ready, or what differs from the spec (a size
	// asked for after it was made).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// ProcessSpec is one process type.
type ProcessSpec struct {
	// command runs the process; empty means the image's entrypoint and command.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Command []string `json:"command,omitempty"`

	// replicas is how many instances run. 0 keeps the type defined but stopped.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Replicas int32 `json:"replicas,omitempty"`

	// resources bound each instance of the type. Unset fields take the platform's
	// defaults (DefaultMemory, no CPU cap).
	// +optional
	Resources *Resources `json:"resources,omitempty"`
}

// DefaultMemory is the memory limit of an instance whose process type sets none:
// 512 MiB, a Heroku standard dyno.
const DefaultMemory = 512 << 20

// DefaultPids is the most processes and threads one instance may have.
const DefaultPids = 4096

// MinMemory and MaxMemory bound resources.memory: below 16 MiB nothing boots, and
// 64 GiB is a guard against typos, not a capacity plan.
const (
	MinMemory = 16 << 20
	MaxMemory = 64 << 30
)

// MinCPUMillis and MaxCPUMillis bound resources.cpu, in thousandths of a CPU.
const (
	MinCPUMillis = 10
	MaxCPUMillis = 64_000
)

// Resources are the limits of one instance.
//
// memory is a hard limit: an instance that uses more is killed by the kernel
// (reported as OOMKilled) and restarted. cpu is a number of CPUs (e.g. "500m",
// "2"): the instance gets at most that much CPU time per period (a CFS quota),
// and under contention a share of the machine in proportion to it (a CPU weight);
// without it an instance may use every CPU, at the weight of one CPU.
//
// The bounds (MinMemory..MaxMemory, MinCPUMillis..MaxCPUMillis) are checked by ps:resources
// and applied by the runtimes (a value outside is taken as the nearest bound): a
// CEL rule on a quantity exceeds the API server's cost budget in a map of 20
// process types.
type Resources struct {
	// memory is the instance's memory limit (e.g. 256Mi, 1Gi). Default 512Mi.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// cpu is how many CPUs the instance may use (e.g. 500m, 2). Default: no cap.
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
}

// MemoryBytes is the memory limit of an instance of the type, default included.
func (p ProcessSpec) MemoryBytes() int64 {
	if p.Resources != nil && p.Resources.Memory != nil {
		return min(max(p.Resources.Memory.Value(), MinMemory), MaxMemory)
	}
	return DefaultMemory
}

// CPUMillis is the CPU cap of an instance of the type in thousandths of a CPU, or
// 0 when it has none.
func (p ProcessSpec) CPUMillis() int64 {
	if p.Resources != nil && p.Resources.CPU != nil {
		return min(max(p.Resources.CPU.MilliValue(), MinCPUMillis), MaxCPUMillis)
	}
	return 0
}

// EnvVar is one config var: a literal value, or a key of a Secret.
// +kubebuilder:validation:XValidation:rule="!(has(self.value) && has(self.valueFrom))",message="set value or valueFrom, not both"
type EnvVar struct {
	// name is a POSIX environment variable name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	Name string `json:"name"`

	// value is the literal value.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	Value string `json:"value,omitempty"`

	// valueFrom takes the value from a key of a Secret in the app's namespace.
	// +optional
	ValueFrom *SecretKeySelector `json:"valueFrom,omitempty"`
}

// SecretKeySelector names one key of a Secret in the same namespace.
type SecretKeySelector struct {
	// name is the Secret's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key is the key within the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// HealthCheck is an HTTP check of the web process.
type HealthCheck struct {
	// path is requested with GET on the instance's PORT; any 2xx or 3xx is healthy.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/\S*$`
	Path string `json:"path"`

	// bootTimeoutSeconds is how long a new instance may take to become healthy
	// before the release fails. Default 60.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=900
	BootTimeoutSeconds int32 `json:"bootTimeoutSeconds,omitempty"`

	// timeoutSeconds bounds each check's request. Default 5.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// DefaultHealthCheckTimeoutSeconds bounds one health check request when the
// check sets no timeoutSeconds.
const DefaultHealthCheckTimeoutSeconds = 5

// DefaultReleaseTimeoutSeconds is how long the release command may run before
// the release fails: 30 minutes: enough for a migration, not for a command that hangs.
const DefaultReleaseTimeoutSeconds = 30 * 60

// Scripts are the commands an app's repository runs around a release.
type Scripts struct {
	// release runs once per new release (a push, a config change, a webhook's or
	// an agent's deploy; not a rollback, a scale or a restart), after the build and
	// before any traffic moves, in a one-off instance of the new image with the new
	// config; what it writes in the instance is not kept. A non-zero exit, or
	// running past releaseTimeoutSeconds, fails the release: the previous one keeps
	// serving. From the Procfile's `release:`. (app.json's
	// `scripts.dokku.predeploy` is no script here: it is the image's last build
	// step, and what it writes is in the image.)
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Release []string `json:"release,omitempty"`

	// releaseTimeoutSeconds bounds the release command. Default 1800.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	ReleaseTimeoutSeconds int32 `json:"releaseTimeoutSeconds,omitempty"`

	// postdeploy runs after each new release of new code (a push, a webhook's or
	// an agent's deploy) serves, in a one-off instance of it (app.json
	// `scripts.dokku.postdeploy`). A non-zero exit fails the release: the App
	// goes back to the release that served before it.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Postdeploy []string `json:"postdeploy,omitempty"`

	// firstPostdeploy runs after the App's first release that serves, in a
	// one-off instance of it (Heroku's app.json `scripts.postdeploy`: seeding a
	// database, registering the app somewhere), and after each later one until it
	// has succeeded once (the App's annotation app.bex.co/first-postdeploy
	// records the release it succeeded with). Its failure is reported; the
	// release serves on.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	FirstPostdeploy []string `json:"firstPostdeploy,omitempty"`
}

// ReleaseTimeout is how long the release command may run, default included.
func (s *Scripts) ReleaseTimeout() int32 {
	if s == nil || s.ReleaseTimeoutSeconds <= 0 {
		return DefaultReleaseTimeoutSeconds
	}
	return s.ReleaseTimeoutSeconds
}

// CronConcurrency says what happens when a cron job is due while its previous
// run still goes (Kubernetes' CronJob concurrencyPolicy, the same words).
// +kubebuilder:validation:Enum=Forbid;Allow;Replace
type CronConcurrency string

// The concurrency policies of a cron job.
const (
	// CronForbid skips the run that is due (the default).
	CronForbid CronConcurrency = "Forbid"
	// CronAllow starts it beside the running one.
	CronAllow CronConcurrency = "Allow"
	// CronReplace stops the running one and starts the new one.
	CronReplace CronConcurrency = "Replace"
)

// CronJob is one scheduled job of an app.
type CronJob struct {
	// id names the job: stable across pushes while its command and schedule are
	// unchanged (CronJobID), so its history and `cron:run APP ID` follow it. Its
	// runs' output is the process `cron.<id>` of `logs`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+$`
	ID string `json:"id"`

	// command is the job's command as app.json gives it (one line, run as the
	// Procfile's commands are).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Command string `json:"command"`

	// schedule is a standard 5-field cron schedule or one of the @ forms (@yearly,
	// @monthly, @weekly, @daily, @hourly, @every <duration>), in UTC unless the
	// app's config sets TZ.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`

	// concurrencyPolicy says what happens when a run is due while the previous
	// one still goes: Forbid (skip it, the default), Allow, or Replace. app.json's
	// `concurrency_policy` (allow, forbid, replace).
	// +optional
	ConcurrencyPolicy CronConcurrency `json:"concurrencyPolicy,omitempty"`
}

// Policy is the job's concurrency policy, default included.
func (c CronJob) Policy() CronConcurrency {
	if c.ConcurrencyPolicy == "" {
		return CronForbid
	}
	return c.ConcurrencyPolicy
}

// CronZone is the zone an app's cron schedules are read in: its TZ config var
// (a literal value; one from a Secret is not read), "" for UTC.
func CronZone(env []EnvVar) string {
	for _, e := range env {
		if e.Name == "TZ" && e.ValueFrom == nil {
			return e.Value
		}
	}
	return ""
}

// CronJobID is the id of the job with this schedule and command: 10 hex digits of
// their SHA-256, so that it stays while the job is unchanged and changes with it.
func CronJobID(schedule, command string) string {
	sum := sha256.Sum256([]byte(schedule + "\x00" + command))
	return hex.EncodeToString(sum[:5])
}

// GitSpec holds an app's repository settings.
type GitSpec struct {
	// deployBranch is the branch whose pushes build and deploy. Empty means the first
	// branch ever pushed, recorded here by the gitserver ("main" when unknown).
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('..') && !self.endsWith('.lock')",message="not a valid git branch name"
	DeployBranch string `json:"deployBranch,omitempty"`

	// upstream is a git URL that webhooks fetch from, for apps whose code lives on
	// another git host: https:// (public), ssh:// or git@host:path (with the
	// gitserver's key), or file:// (a repository on the gitserver's machine; the
	// gitserver refuses it unless started with --allow-file-upstreams, since it
	// could name another app's repository).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^(https://|ssh://|git@|file:///)\S+$`
	Upstream string `json:"upstream,omitempty"`

	// webhookSecretRef is the Secret key holding the shared secret that signs this
	// app's webhooks. The Secret lives in the gitserver's secrets namespace (bex
	// gitserver --secrets-namespace: the App's own namespace by default, bex-system
	// on a cluster), not necessarily the App's; `webhooks:secret APP` makes it
	// ("<app>-webhook") and sets this reference.
	// +optional
	WebhookSecretRef *SecretKeySelector `json:"webhookSecretRef,omitempty"`
}

// BuildSpec says how an app's commits are built.
type BuildSpec struct {
	// dir is the build directory inside the repository, for monorepos; empty is the
	// repository's root.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`
	Dir string `json:"dir,omitempty"`

	// dockerfile is the Dockerfile's path inside dir; empty means "Dockerfile", and a
	// generated one when there is none.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`
	Dockerfile string `json:"dockerfile,omitempty"`

	// target is the Dockerfile stage to build; empty is the last one.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	Target string `json:"target,omitempty"`

	// args are the build arguments (Dockerfile ARG).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	Args []BuildArg `json:"args,omitempty"`
}

// BuildArg is one build argument.
type BuildArg struct {
	// name is the ARG's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	Name string `json:"name"`

	// value is its value.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`
}

// AppPhase is a one-word summary of an app's state, for people. Controllers decide
// from conditions, never from the phase.
// +kubebuilder:validation:Enum=Pending;Building;Deploying;Running;Failed;Suspended
type AppPhase string

// The phases of an App.
const (
	// AppPhasePending: no release has been rolled out yet.
	AppPhasePending AppPhase = "Pending"
	// AppPhaseBuilding: a push is being built.
	AppPhaseBuilding AppPhase = "Building"
	// AppPhaseDeploying: a release is rolling out.
	AppPhaseDeploying AppPhase = "Deploying"
	// AppPhaseRunning: the current release serves and is healthy.
	AppPhaseRunning AppPhase = "Running"
	// AppPhaseFailed: the last build or rollout failed; see the conditions.
	AppPhaseFailed AppPhase = "Failed"
	// AppPhaseSuspended: every process is stopped on purpose.
	AppPhaseSuspended AppPhase = "Suspended"
)

// AppStatus is the observed state of an App.
type AppStatus struct {
	// phase summarises the conditions for people. Do not base decisions on it.
	// +optional
	Phase AppPhase `json:"phase,omitempty"`

	// revision is the number of the Release that serves traffic now.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Revision int64 `json:"revision,omitempty"`

	// url is where the app answers.
	// +optional
	URL string `json:"url,omitempty"`

	// conditions are the app's observations: Ready, Built, RolledOut.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// cron is what the runtime saw of each cron job's runs, by job id.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=50
	Cron []CronJobStatus `json:"cron,omitempty"`

	// volumes are the volumes of spec.volumes the runtime has, by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Volumes []VolumeStatus `json:"volumes,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// CronJobStatus is what is known of one cron job's runs.
type CronJobStatus struct {
	// id is the job's id (CronJob.id).
	ID string `json:"id"`

	// lastRun is when the last run started.
	// +optional
	LastRun *metav1.Time `json:"lastRun,omitempty"`

	// lastExitCode is the last finished run's exit status; unset while none has
	// finished.
	// +optional
	LastExitCode *int32 `json:"lastExitCode,omitempty"`

	// running counts the runs going now.
	// +optional
	Running int32 `json:"running,omitempty"`

	// consecutiveFailures counts the finished runs in a row that exited non-zero;
	// 0 after a success.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`

	// skipped counts the runs skipped because the previous one still went (Forbid).
	// +optional
	Skipped int32 `json:"skipped,omitempty"`
}

// CronFailingThreshold is how many failed runs in a row make a cron job
// "failing" in apps:info and app_status.
const CronFailingThreshold = 3

// CronRunAnnotation+"."+<job id> on an App asks for one run of that cron job now
// (`cron:run APP ID`): set it to the current time (RFC3339Nano). The runtime starts
// one run for each new value, as RestartedAtAnnotation restarts; an annotation, not
// spec, since a run changes nothing of what the app is.
const CronRunAnnotation = "app.bex.co/cronRunAt"

// CronRuns maps each job id to its last cron:run token (the annotation's value).
func (a *App) CronRuns() map[string]string {
	out := map[string]string{}
	for k, v := range a.Annotations {
		if id, ok := strings.CutPrefix(k, CronRunAnnotation+"."); ok && id != "" {
			out[id] = v
		}
	}
	return out
}

// AppList is a list of Apps.
//
// +kubebuilder:object:root=true
type AppList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []App `json:"items"`
}
