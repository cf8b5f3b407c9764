package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Desired is what should run for one app: one release, its processes, its config.
type Desired struct {
	// App is the App object, for its name, namespace, UID (owner references) and
	// labels. Runtimes must not modify it.
	App *appv1.App
	// Release is the number of the release to run (the App's spec.release).
	Release int64
	// Image is the release's digest-pinned image.
	Image string
	// Processes are the process types: command (empty: the image's own) and replicas.
	Processes map[string]appv1.ProcessSpec
	// Env are the config vars; values from Secrets are resolved by the runtime.
	Env []appv1.EnvVar
	// HealthCheck, when set, is the HTTP check of web instances; otherwise an
	// instance is ready when its PORT accepts TCP connections.
	HealthCheck *appv1.HealthCheck
	// Servers are process types besides web whose instances serve TCP on their
	// PORT (a database's server): an instance is ready once PORT accepts a
	// connection, and ProcessStatus.Addresses names the ready ones. Nothing is
	// published for them (no endpoints, no route): whoever asked for them
	// decides who reaches them.
	Servers []string
	// Suspended stops every instance; the endpoints become empty.
	Suspended bool
	// Volumes are the app's volumes (spec.volumes): the runtime makes each that
	// does not exist, mounts it in the instances of the process types it names
	// (all when it names none) and in every one-off, and deletes, with their
	// data, the volumes it has that are no longer listed once no instance uses
	// them. A change of the volumes replaces the instances as a rollout does.
	Volumes []appv1.Volume
	// Restarts maps a process type to its restart token (App.RestartToken); a
	// type missing here has none. When a type's token changes, its instances are
	// replaced the way a rollout replaces them (new ones healthy first, then the old
	// ones drain and stop); other types are left running.
	Restarts map[string]string
	// Cron are the app's cron jobs, run as one-offs of this release (image, env)
	// on their schedules (in TZ, the app's config var, else UTC); empty removes
	// them. A job that is running when a new release rolls out finishes on its
	// old release.
	Cron []appv1.CronJob
	// CronRuns maps a job id to its last cron:run token (App.CronRuns): a token not
	// seen before starts one run of the job now, whatever its policy says.
	CronRuns map[string]string
}

// Key is the app's namespace and name.
func (d Desired) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: d.App.Namespace, Name: d.App.Name}
}

// Status is what a runtime observed after a Sync.
type Status struct {
	// Serving is the release whose instances receive the traffic now (0: none).
	Serving int64
	// RolledOut is true when every desired instance of the desired release is ready
	// and no instance of another release is left (or, suspended, none runs).
	RolledOut bool
	// Failure, when not empty, says why the desired release cannot come up (one
	// of the Reason constants of the API package, e.g. HealthCheckFailed,
	// CrashLoop, ImageNotFound, OOMKilled); Message says it for a person. Older
	// instances keep serving meanwhile. A release that serves may report one
	// too while an instance of it is down (OOMKilled, CrashLoop): it is being
	// restarted.
	Failure string
	Message string
	// Note, while the release rolls out, is what a person watching the
	// rollout should know of how it goes (e.g. that it is a short downtime);
	// the rollout's progress says it after the ready counts.
	Note string
	// Processes reports each process type of the desired release.
	Processes map[string]ProcessStatus
	// Addresses are, for each type of Desired.Servers, where the host reaches
	// its ready instances of the desired release (address and PORT).
	Addresses map[string][]netip.AddrPort
	// Cron reports each cron job of Desired.Cron that has run or is running.
	Cron []CronStatus
	// Volumes reports every volume the runtime has for the app: those of
	// Desired.Volumes (Ready once made and mountable) and those still being
	// deleted (not Ready, the message says what holds them). A volume that is
	// not listed does not exist.
	Volumes []appv1.VolumeStatus
}

// ProcessStatus is one process type's instances.
type ProcessStatus struct {
	Desired  int32
	Ready    int32
	Restarts int32
	// OOMKills counts the restarts that followed a kill by the memory limit.
	OOMKills int32
}

// Runtime runs apps.
type Runtime interface {
	// Sync moves the app one step toward d and reports where it is: it starts
	// instances of d.Release that are missing, checks their health, moves the
	// endpoints to ready instances of d.Release only once all of them are ready,
	// then stops the older instances after a drain period. It does not wait for
	// slow steps: the reconciler calls it again until Status.RolledOut or
	// Status.Failure. A release that fails leaves the older instances serving.
	// Errors are for failures of the runtime itself (containerd or the API
	// unreachable), not of the app.
	Sync(ctx context.Context, d Desired) (Status, error)
	// Delete stops every instance of the app and removes its endpoints; it is
	// idempotent.
	Delete(ctx context.Context, app types.NamespacedName) error
}

// Notifier is a Runtime that learns of changes between Syncs (an instance became
// ready, exited or stopped) and names the app, so that the reconciler syncs it at
// once instead of at its next requeue: a rollout then finishes when its last
// instance is ready, not up to a requeue interval later.
type Notifier interface {
	// Changes receives the apps whose state changed. A slow reader loses nothing
	// that matters: the reconciler's requeue still comes.
	Changes() <-chan types.NamespacedName
}

// Capabilities is the capability set of an app's processes on both runtimes:
// Docker's default without NET_RAW (raw sockets: ARP and ICMP spoofing of the
// neighbours) and MKNOD (a device node is of no use in a user namespace). The
// local runtime sets exactly these; the kubernetes runtime drops ALL and adds
// these back (without the CAP_ prefix). In a user namespace they act on the
// container's own files and processes only.
var Capabilities = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// Images is a Runtime that can remove the images it runs, so that the
// reconciler removes the images of the Releases it prunes and of the Apps that
// are deleted. The local runtime removes them from containerd's image store on
// this machine; the kubernetes runtime deletes their manifests from the
// registry the images were pushed to (whose garbage collection then frees the
// blobs), when configured to.
type Images interface {
	// RemoveImages removes the images remove names (digest-pinned references
	// <repo>@sha256:..., as in Release.spec.image) unless keep names the same
	// digest or a container the runtime has (running, draining or not yet
	// removed) was made from it. Only image names under repo (<repo>:<tag>,
	// <repo>@<digest>) are touched: a reference of another repository is
	// ignored, and a name of another repository that shares a digest is left as
	// it is. Content and snapshots that nothing else holds go with them. It
	// returns the references of remove left because a container uses them: the
	// caller keeps those releases and asks again later, so that the image does
	// not outlive its last release. An image already gone is no error.
	RemoveImages(ctx context.Context, repo string, remove, keep []string) (inUse []string, err error)
	// RemoveRepository removes every image under repo (<repo>:<tag>,
	// <repo>@<digest>), those of releases and those of builds that never became
	// one, when the app they belong to is deleted. refs are digest-pinned
	// references the caller knows of (its Releases' images), for a store that
	// cannot list them all (a registry lists tags only). Names of other
	// repositories are untouched, even on the same digest. inUse is true when a
	// container still uses one of them (it was left; ask again later). A
	// repository already empty or gone is no error.
	RemoveRepository(ctx context.Context, repo string, refs []string) (inUse bool, err error)
}

// OneOff is one command run to its end in a new instance of an app's release: a
// `run`, the release phase, a postdeploy script, a cron job's run. It gets the
// app's confinement, network and config, and the limits of Resources; it is never
// restarted, receives no traffic, and is removed when the command ends, when ctx
// ends (the session went), or after Timeout.
type OneOff struct {
	// App is the App object (name, namespace, UID); runtimes must not modify it.
	App *appv1.App
	// ID names this run: 12 lower-case hex digits or letters, unique per app
	// (NewOneOffID). The instance's labels carry it (appv1.LabelOneOff).
	ID string
	// Process is what the run is, and the process name its output is kept under
	// for `logs --process`: "run.<id>", "release", "postdeploy", "cron.<job id>".
	Process string
	// Release is the release number whose image and config it runs (0: none yet,
	// the release phase of a first push), for labels and logs.
	Release int64
	// Image is the digest-pinned image.
	Image string
	// Command is the argv; empty is the image's own entrypoint and command.
	Command []string
	// Expand says that Command is written as a container's command is, like the
	// App's processes and scripts (builder/plan escapes a Procfile's line so): the
	// runtime expands $(NAME) from the instance's environment, PORT included, and
	// $$ is one $. False: Command is taken as it is (a `run`'s argv, a cron job's
	// sh -c).
	Expand bool
	// Env are the config vars; values from Secrets are resolved by the runtime.
	// PORT is set by the runtime, as for any instance (nothing routes to it).
	Env []appv1.EnvVar
	// Resources bound the instance (memory, cpu), defaults as for a process type.
	Resources *appv1.Resources
	// Timeout ends the run (the process is killed, exit status 137) when it runs
	// longer; 0 means no bound besides ctx.
	Timeout time.Duration

	// Stdin, when not nil, is copied to the process's standard input, which is
	// closed when Stdin ends (EOF). Nil: the process's stdin is empty.
	Stdin io.Reader
	// Stdout and Stderr, when not nil, receive the process's output as it comes,
	// besides the instance's log (with a TTY, both streams are one: Stdout).
	Stdout, Stderr io.Writer
	// TTY, when not nil, gives the process a pseudo-terminal of this size and
	// term; the sizes sent on Resize follow (the window of `ssh -t`), until it is
	// closed or the run ends. Ctrl-C is the byte 0x03 on Stdin: the terminal turns
	// it into SIGINT for the foreground process, as on any terminal.
	TTY *TTY
}

// TTY is a one-off's pseudo-terminal.
type TTY struct {
	Term   string // TERM, e.g. xterm-256color
	Width  uint16 // columns
	Height uint16 // rows
	Resize <-chan WindowSize
}

// WindowSize is a terminal's size in characters.
type WindowSize struct {
	Width, Height uint16
}

// OneOffs runs one-off instances. Both runtimes implement it: the local one with
// a containerd container confined as the app's instances are, the kubernetes one
// with a Pod attached through the API server.
type OneOffs interface {
	// Run runs o to its end and returns the command's exit status (128+n for a
	// process killed by signal n; 137 after Timeout). The instance is gone when it
	// returns. An error is for a run that could not start or be followed (the
	// image is missing, the runtime unreachable): exit is then -1.
	Run(ctx context.Context, o OneOff) (exit int, err error)
	// Start starts o detached and returns once it runs: its output goes to the
	// instance's log only (`logs APP --process <o.Process>`), and it is removed
	// when the command ends or after o.Timeout. o.Stdin, Stdout, Stderr and TTY
	// are ignored. done, when not nil, is called once with the exit status when it
	// ends (-1 when it could not be followed to its end).
	Start(ctx context.Context, o OneOff, done func(exit int)) error
}

// NewOneOffID returns a fresh one-off id.
func NewOneOffID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CronStatus is what a runtime knows of a cron job's runs; the reconciler writes
// it to the App's status.cron.
type CronStatus = appv1.CronJobStatus
