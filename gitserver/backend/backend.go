package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/dbbackups"
	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/gitserver/upstream"
)

// Releases records an app's releases and waits for them to serve: the
// deployer's releases.Recorder, which cmd/bex wires.
type Releases interface {
	// RecordConfig records a release of app whose config vars are edit of the
	// current ones (cause Config) and points the App at it; edit runs on the App
	// as read for the write, so concurrent changes are not lost. The app's release
	// command runs first with the new config, its output going to progress; when it
	// fails, the error says so and the config is unchanged.
	RecordConfig(ctx context.Context, app string, edit func([]appv1.EnvVar) []appv1.EnvVar, actor, description string, progress io.Writer) (int64, error)
	// Rollback records a release that runs release to's image and config again.
	Rollback(ctx context.Context, app string, to int64, actor string) (int64, error)
	// List returns app's releases, newest first.
	List(ctx context.Context, app string) ([]appv1.Release, error)
	// Await waits for release n of app to serve and returns the app's URL,
	// calling progress with each new message of the deployer. When the rollout
	// fails it withdraws the release and returns a RolloutFailure; when ctx ends
	// first, ctx's error.
	Await(ctx context.Context, app string, n int64, progress func(string)) (string, error)
}

// ReleaseCommandFailure is implemented by the error of a config change whose
// release command failed before anything was written (the deployer's
// releases.ReleaseCommandError): ReleaseCommandFailed returns that release.
type ReleaseCommandFailure interface {
	error
	ReleaseCommandFailed() int64
}

// KeepsServing is implemented by a deploy's error whose rollout failed with
// the deployer naming the release that serves on (its reason says "Release vN
// keeps serving."): KeepsServing returns N, 0 when it named none. What the
// backend adds to a failure then does not say it again.
type KeepsServing interface {
	error
	KeepsServing() int64
}

// RolloutFailure is Releases.Await's error when the release did not come to
// serve: its method says why, in the deployer's words, as data rather than
// text to cut out of the error's message.
type RolloutFailure interface {
	error
	RolloutFailure() (reason string)
}

// CodeDeployer builds an app's code and rolls it out outside a push, through
// the push's pipeline and lock (gitserver/pipeline's Deploy; cmd/bex wires
// it). Its errors carry kinds: NotFound (no app), Invalid (nothing to deploy),
// Conflict (a push or deploy holds the app), Failed (the build or rollout
// failed).
type CodeDeployer interface {
	Deploy(ctx context.Context, req DeployRequest) (*DeployResult, error)
}

// DeployCause is what asked for a deploy.
type DeployCause string

// The causes of a CodeDeployer's deploys.
const (
	CauseDeploy  DeployCause = "deploy"
	CauseWebhook DeployCause = "webhook"
)

// DeployRequest is one deploy.
type DeployRequest struct {
	App string
	// Upstream, when set, is fetched and its deploy branch deployed.
	Upstream string
	// Commit, when set, is built in place of the deploy branch's tip.
	Commit   string
	Cause    DeployCause
	Actor    string
	Delivery string
}

// DeployResult is a deploy that serves.
type DeployResult struct {
	Release int64
	Commit  string
	URL     string
}

// RuntimeLogs reads what an app's processes print.
type RuntimeLogs interface {
	// Logs writes app's recent lines (and, with Follow, new ones until ctx ends)
	// to w, each prefixed with its instance.
	Logs(ctx context.Context, app string, opts LogOptions, w io.Writer) error
}

// LogOptions select runtime log lines.
type LogOptions struct {
	// Follow keeps writing new lines until ctx ends.
	Follow bool
	// Lines is how many recent lines of each instance to show first (0: a default).
	Lines int
	// Process, when not empty, keeps the lines of that process type only.
	Process string
}

// BuildLogs are the stored records and outputs of an app's recent builds.
type BuildLogs interface {
	// List returns app's builds, newest first.
	List(app string) ([]BuildInfo, error)
	// Open opens one build's log; an error wrapping fs.ErrNotExist when there is
	// no such build.
	Open(app, id string) (io.ReadCloser, error)
}

// Config is what the backend works with. cmd/bex fills it.
type Config struct {
	// Client writes to the API server and reads what must not be stale (Users a
	// key decision rests on, fresh reads before a write).
	Client client.Client
	// Reader reads Apps and Users, usually from an informer cache. Nil: Client.
	Reader client.Reader
	// Namespace holds the Apps.
	Namespace string
	// SecretsNamespace holds the webhook secrets and the tokens. Empty: Namespace.
	SecretsNamespace string
	// ConfigSecrets reads the Secrets in Namespace that config vars take their
	// values from (a database link's credentials), for ConfigValues only: the
	// masking of those values in what agents are shown of an app's output. Nil
	// where the gitserver may not read them (a cluster: its RBAC grants it no
	// Secret of the apps' namespace); those values are then not masked.
	ConfigSecrets client.Reader
	// Releases records and awaits config changes and rollbacks.
	Releases Releases
	// Deployer runs deploys and webhook redeploys; nil: deploy says this server
	// does not build.
	Deployer CodeDeployer
	// Images deploys images from registries (deploy:image); nil: it says this
	// server does not.
	Images ImageDeployer
	// Registries tries registry logins before registry:login keeps them; nil:
	// registry:login says this server keeps none.
	Registries RegistryChecker
	// Logs reads runtime logs; nil: logs says they are not available.
	Logs RuntimeLogs
	// Builds reads build logs; nil: builds says they are not available.
	Builds BuildLogs
	// Runner runs one-off commands (run); nil: run says this server cannot.
	Runner Runner
	// Storage measures and prunes the state dir's disk (system:df,
	// system:prune, apps:info's bytes); nil: those say this server cannot.
	Storage Storage
	// Volumes reads and replaces volumes' contents (volumes' usage,
	// volumes:backup, volumes:restore); nil: those say this server cannot.
	Volumes VolumeStore
	// Backups keeps Postgres databases' dumps on this server (postgres:backups,
	// postgres:backups:capture, the schedule, postgres:restore --backup); nil:
	// those say this server keeps none.
	Backups *dbbackups.Store
	// DiskCheck says whether the server's disk is short of the margin under
	// which pushes and deploys are refused (the pipeline's CheckDisk): nil
	// when it is not; for diagnose. Nil: not measured.
	DiskCheck func() error
	// Certificates reads the edge's certificate state of an app's hosts
	// (diagnose); nil: diagnose says this server does not know it.
	Certificates Certificates
	// Traffic reads the edge's request figures per app (metrics, diagnose);
	// nil: those say this server has no edge figures.
	Traffic Traffic
	// Audit keeps the audit trail: every change, from every way in (audit,
	// audit:json, the MCP tool audit); nil: changes are logged only, and
	// audit says this server keeps no trail.
	Audit *audit.Store
	// Tokens keeps the agents' API tokens; nil: there is no agents' API.
	Tokens *tokens.Store
	// RemoveRepository deletes an app's git repository (apps:destroy); nil:
	// nothing to remove.
	RemoveRepository func(ctx context.Context, app string) error
	// RemoveBuildLogs deletes an app's stored build logs (apps:destroy), so that
	// an app made later under the same name does not show them; nil: nothing to
	// remove.
	RemoveBuildLogs func(app string) error
	// UpstreamPolicy is what upstreams webhooks:upstream accepts: the gitserver's
	// (--allow-private-upstreams, --allow-file-upstreams), checked again at each
	// fetch.
	UpstreamPolicy upstream.Policy
	// BaseDomain is the domain apps answer under (<app>.<base>), as the
	// deployer and the edge have it: domains:add refuses members names of it
	// (platformName). Empty: no name is the platform's.
	BaseDomain string
	// Host is how users reach the gitserver, for hints ("ssh://git@HOST:PORT").
	Host string
	// HooksURL is the base URL of the webhooks and the MCP endpoint
	// ("https://bex.example.com"); empty: this server serves neither.
	HooksURL string
	// RolloutTimeout bounds how long a config change or rollback waits for its
	// release to serve.
	RolloutTimeout time.Duration
	// CacheWait bounds how long a write waits for Reader to see it.
	CacheWait time.Duration
	// Log receives the audit lines and internal errors; nil: slog.Default().
	Log *slog.Logger
}

// DefaultConfig returns the defaults of the settings that have one. CacheWait:
// a healthy watch delivers an event in milliseconds, but on a loaded machine
// (two cores running builds and tests) it was seen to take more than 5 s; half
// a minute means it is broken.
func DefaultConfig() Config {
	return Config{Host: "ssh://git@HOST:PORT", BaseDomain: "localhost", RolloutTimeout: 5 * time.Minute, CacheWait: 30 * time.Second}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("backend: Config.Client is required"))
	}
	if c.Releases == nil {
		errs = append(errs, errors.New("backend: Config.Releases is required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("backend: Config.Namespace is required"))
	}
	if c.Host == "" {
		errs = append(errs, errors.New("backend: Config.Host is required (DefaultConfig has one)"))
	}
	if c.RolloutTimeout <= 0 {
		errs = append(errs, fmt.Errorf("backend: Config.RolloutTimeout %s must be positive", c.RolloutTimeout))
	}
	if c.CacheWait <= 0 {
		errs = append(errs, fmt.Errorf("backend: Config.CacheWait %s must be positive", c.CacheWait))
	}
	return errors.Join(errs...)
}

// Backend is every operation that comes in through the gitserver. It is safe
// for concurrent use.
type Backend struct {
	cfg  Config
	log  *slog.Logger
	runs runCounter
}

// New checks cfg and returns the backend.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Reader == nil {
		cfg.Reader = cfg.Client
	}
	// Every write of the backend's goes through the guard, which refuses it in
	// a dry run: a dry run changes nothing even where an operation did not
	// stop at wouldChange.
	cfg.Client = dryRunGuard{cfg.Client}
	if cfg.SecretsNamespace == "" {
		cfg.SecretsNamespace = cfg.Namespace
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	return &Backend{cfg: cfg, log: log.WithGroup("backend")}, nil
}

// Host is how users reach the gitserver ("ssh://git@HOST:PORT").
func (b *Backend) Host() string { return b.cfg.Host }

// audit logs a change and keeps it in the audit trail: who (user, key or
// token, the agent's client and reason), what (the operation, by the name of
// its ssh command), which app, and attrs, the operation's own facts ("before"
// and "release" are the releases before and after it, "database" the
// database it worked on).
func (b *Backend) audit(u *User, op, app string, attrs ...any) {
	b.log.Info("audit", append([]any{"user", u.Name, "key", u.KeyName, "fingerprint", u.KeyFingerprint, "command", op, "app", app}, attrs...)...)
	b.keep(entryOf(u, op, app, attrs))
}

// Internal logs err, an internal failure of op for u, so that the front-ends
// need not each decide what to log.
func (b *Backend) Internal(u *User, op string, err error) {
	name := ""
	if u != nil {
		name = u.Name
	}
	b.log.Error("operation failed", "user", name, "command", op, "err", err)
}

func (b *Backend) key(app string) client.ObjectKey {
	return client.ObjectKey{Namespace: b.cfg.Namespace, Name: app}
}

// requireAdmin refuses what is for admins to others, and to an admin's
// limited token (unlimited).
func requireAdmin(u *User, what string) error {
	if !u.Admin {
		return Errorf(Forbidden, "%s is for admins, and %s is not one: ask an admin", what, u.Name)
	}
	return u.unlimited(what)
}
