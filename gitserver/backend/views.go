package backend

import (
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/upstream"
)

// The view types: what the front-ends show of bex's objects, one set for the
// ssh commands' --json output and the MCP tools' structured content. Their JSON
// is a documented schema (docs/commands.md): add fields, never rename them.

// AppSummary is one app of a listing.
type AppSummary struct {
	Name      string `json:"name"`
	Phase     string `json:"phase" jsonschema:"Pending, Building, Deploying, Running, Failed or Suspended"`
	Revision  int64  `json:"revision" jsonschema:"the release that serves now (0: none)"`
	URL       string `json:"url"`
	Suspended bool   `json:"suspended"`
}

// AppInfo is one app in full.
type AppInfo struct {
	Name      string `json:"name"`
	Phase     string `json:"phase" jsonschema:"Pending, Building, Deploying, Running, Failed or Suspended"`
	Release   int64  `json:"release" jsonschema:"the release the app asks for"`
	Revision  int64  `json:"revision" jsonschema:"the release that serves now"`
	URL       string `json:"url"`
	Image     string `json:"image"`
	Suspended bool   `json:"suspended"`
	// DeployBranch is the branch whose pushes deploy: main until the first push
	// names it, as webhooks read it.
	DeployBranch string `json:"deployBranch"`
	// Upstream is where webhook deliveries and deploys fetch from, or "".
	Upstream   string        `json:"upstream,omitempty"`
	GitURL     string        `json:"gitURL"`
	Members    []string      `json:"members"`
	Domains    []string      `json:"domains"`
	Processes  []ProcessInfo `json:"processes"`
	Conditions []Condition   `json:"conditions"`
	Created    time.Time     `json:"created"`
	// LastBuild and LastRelease are the newest of each, when there is one.
	LastBuild   *BuildInfo   `json:"lastBuild,omitempty"`
	LastRelease *ReleaseInfo `json:"lastRelease,omitempty"`
	// Trouble and TroubleMessage are the RolledOut condition's reason and
	// message when it is not true (e.g. OOMKilled), else "".
	Trouble        string `json:"trouble,omitempty"`
	TroubleMessage string `json:"troubleMessage,omitempty"`
	// Disk is the app's own bytes on disk (system:df's row of the app), when
	// this server measures them.
	Disk *AppUsage `json:"disk,omitempty"`
	// Cron are the app's cron jobs and what is known of their runs.
	Cron []CronJobInfo `json:"cron"`
	// Databases are the databases the app is linked to: its config takes a
	// variable from their credentials (postgres:link, redis:link).
	Databases []string `json:"databases"`
}

// CronJobInfo is one cron job (`cron APP --json`: the first six fields are a
// contract, in this order).
type CronJobInfo struct {
	ID       string `json:"id"`
	Command  string `json:"command"`
	Schedule string `json:"schedule"`
	// LastRun is when the last run started; null before the first.
	LastRun *time.Time `json:"lastRun"`
	// LastExitCode is the last finished run's exit status; null while none
	// finished (-1: a run that could not be started or followed).
	LastExitCode *int32 `json:"lastExitCode"`
	// NextRun is when the schedule is due next (in TZ, the app's config var,
	// else UTC); null when the schedule cannot be read or never comes.
	NextRun           *time.Time `json:"nextRun"`
	ConcurrencyPolicy string     `json:"concurrencyPolicy" jsonschema:"Forbid (a due run is skipped while one goes), Allow or Replace"`
	Running           int32      `json:"running"`
	// ConsecutiveFailures counts the finished runs in a row that exited non-zero.
	ConsecutiveFailures int32 `json:"consecutiveFailures"`
	Skipped             int32 `json:"skipped" jsonschema:"runs skipped because the previous one still went"`
	// Failing is ConsecutiveFailures >= 3 (appv1.CronFailingThreshold).
	Failing bool `json:"failing"`
	// Error says why the schedule cannot be used, when it cannot.
	Error string `json:"error,omitempty"`
}

// Condition is one status condition of an app.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// ProcessInfo is one process type.
type ProcessInfo struct {
	Type     string   `json:"type"`
	Command  []string `json:"command"`
	Replicas int32    `json:"replicas"`
	// RestartedAt is the last ps:restart of the type or the app (RFC3339), or "".
	RestartedAt string `json:"restartedAt"`
	// Resources are the limits of each instance, defaults included.
	Resources ResourceInfo `json:"resources" jsonschema:"the limits of each instance: memory (over it the instance is killed, reason OOMKilled, and restarted) and CPUs (empty: no cap)"`
}

// ResourceInfo is what one instance of a process type may use, defaults
// included.
type ResourceInfo struct {
	// Memory is the memory limit as a quantity ("512Mi"), MemoryBytes in bytes.
	Memory      string `json:"memory"`
	MemoryBytes int64  `json:"memoryBytes"`
	// CPU is the CPU cap in CPUs ("2", "500m"), or "" for none.
	CPU string `json:"cpu"`
	// Default is true when the type sets nothing and has the platform's defaults.
	Default bool `json:"default"`
}

// Processes is an app's process types and what ails them.
type Processes struct {
	App       string        `json:"app"`
	Phase     string        `json:"phase"`
	Revision  int64         `json:"revision"`
	Suspended bool          `json:"suspended"`
	Processes []ProcessInfo `json:"processes"`
	// Trouble is the RolledOut condition's reason and message when it is not
	// true (e.g. OOMKilled: an instance was killed by its memory limit), else "".
	Trouble        string `json:"trouble"`
	TroubleMessage string `json:"troubleMessage"`
}

// ProcessResources is the limits of one process type of an app.
type ProcessResources struct {
	App       string       `json:"app"`
	Type      string       `json:"type"`
	Resources ResourceInfo `json:"resources"`
}

// ReleaseInfo is one release.
type ReleaseInfo struct {
	Number      int64  `json:"number"`
	Cause       string `json:"cause"`
	Actor       string `json:"actor"`
	Description string `json:"description"`
	Image       string `json:"image"`
	Commit      string `json:"commit"`
	// Delivery is the webhook delivery that caused it, for cause Webhook.
	Delivery   string    `json:"delivery,omitempty"`
	RollbackOf int64     `json:"rollbackOf,omitempty"`
	Created    time.Time `json:"created"`
	// Current is the release the app's spec names; Serving the one that serves.
	Current bool `json:"current"`
	Serving bool `json:"serving"`
	// Failed says why the release never served (its rollout failed and it was
	// withdrawn); empty for the others.
	Failed string `json:"failed,omitempty" jsonschema:"why the release never served, when it did not"`
}

// BuildInfo is one build: its record, newest first in listings.
type BuildInfo struct {
	ID     string    `json:"id"`
	Commit string    `json:"commit"`
	Time   time.Time `json:"time"`
	// Result is running, succeeded, failed or canceled, as the builder recorded it.
	Result string `json:"result" jsonschema:"running, succeeded, failed or canceled"`
	// Error is why a failed build failed, in one line.
	Error string `json:"error,omitempty"`
}

// ConfigVar is one config var: a literal value, or a reference to a Secret key
// (whose value is not shown).
type ConfigVar struct {
	Name   string     `json:"name"`
	Value  *string    `json:"value,omitempty"`
	Secret *SecretRef `json:"secret,omitempty"`
}

// SecretRef names a key of a Secret in the app's namespace.
type SecretRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// ConfigList is an app's config vars, in order.
type ConfigList struct {
	App    string      `json:"app"`
	Config []ConfigVar `json:"config"`
}

// DomainList is an app's custom domains.
type DomainList struct {
	App string `json:"app"`
	// URL is where the app answers by default.
	URL     string   `json:"url"`
	Domains []string `json:"domains"`
}

// AccessList is who may use an app besides admins.
type AccessList struct {
	App     string   `json:"app"`
	Members []string `json:"members"`
}

// WhoAmI is who a user is to this server.
type WhoAmI struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	CanCreateApps bool   `json:"canCreateApps"`
	Key           string `json:"key"`
	Fingerprint   string `json:"fingerprint"`
}

// KeyInfo is one SSH key of a user.
type KeyInfo struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Fingerprint string `json:"fingerprint"`
	Comment     string `json:"comment"`
	// Current is the key this session authenticated with.
	Current bool `json:"current"`
}

// UserInfo is one user.
type UserInfo struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	CanCreateApps bool   `json:"canCreateApps"`
	Keys          int    `json:"keys"`
}

// WebhookInfo is an app's webhook.
type WebhookInfo struct {
	App string `json:"app"`
	// URL is where deliveries go, or "" when this server serves no webhooks.
	URL       string `json:"url"`
	SecretSet bool   `json:"secretSet"`
	// PreviousValidUntil is when the secret the last rotation replaced stops
	// verifying, while it still does.
	PreviousValidUntil *time.Time `json:"previousValidUntil,omitempty"`
	// Ref is the full ref whose pushes deploy.
	Ref string `json:"ref"`
	// Upstream is fetched on each delivery, or "".
	Upstream string `json:"upstream"`
	// DeployKey is the public key (authorized_keys form) of the app's own deploy
	// key, the one bex fetches its ssh upstreams with.
	DeployKey string `json:"deployKey,omitempty"`
	// UpstreamUsername is the username kept for the upstream (its password is
	// never shown), or "".
	UpstreamUsername string `json:"upstreamUsername,omitempty"`
}

// DeployKeyInfo is an app's deploy key.
type DeployKeyInfo struct {
	App string `json:"app"`
	// DeployKey is the public key, authorized_keys form.
	DeployKey string `json:"deployKey"`
	// Rotated says the key is new: the old one no longer fetches.
	Rotated bool `json:"rotated"`
}

// UpstreamCredentials are the username and password an https upstream is
// fetched with (http basic auth), kept in a Secret.
type UpstreamCredentials struct {
	Username, Password string
}

// WebhookSecret is a new webhook secret, shown once.
type WebhookSecret struct {
	App                string     `json:"app"`
	URL                string     `json:"url"`
	Secret             string     `json:"secret"`
	PreviousValidUntil *time.Time `json:"previousValidUntil,omitempty"`
}

// TokenCreated is a new token, shown once.
type TokenCreated struct {
	Name  string `json:"name"`
	User  string `json:"user"`
	Token string `json:"token"`
	// MCP is the endpoint the token is for, or "" when this server serves none.
	MCP     string     `json:"mcp"`
	Expires *time.Time `json:"expires,omitempty"`
	// Scope is what the token is limited to; zero: what its user may do.
	Scope TokenScope `json:"scope"`
}

// Phase is a's phase for people: Pending until the deployer says otherwise.
func phase(a *appv1.App) string {
	if a.Status.Phase == "" {
		return string(appv1.AppPhasePending)
	}
	return string(a.Status.Phase)
}

func summaryOf(a *appv1.App) AppSummary {
	return AppSummary{Name: a.Name, Phase: phase(a), Revision: a.Status.Revision, URL: a.Status.URL, Suspended: a.Spec.Suspended}
}

func deployBranch(a *appv1.App) string {
	if a.Spec.Git.DeployBranch == "" {
		return appv1.DefaultDeployBranch
	}
	return a.Spec.Git.DeployBranch
}

// trouble is the RolledOut condition when it is not true.
func trouble(a *appv1.App) (string, string) {
	c := meta.FindStatusCondition(a.Status.Conditions, appv1.RolledOutCondition)
	if c == nil || c.Status == metav1.ConditionTrue {
		return "", ""
	}
	return c.Reason, c.Message
}

func infoOf(a *appv1.App, host string) *AppInfo {
	in := &AppInfo{Name: a.Name, Phase: phase(a), Release: a.Spec.Release, Revision: a.Status.Revision, URL: a.Status.URL,
		Image: a.Spec.Image, Suspended: a.Spec.Suspended, DeployBranch: deployBranch(a), Upstream: upstream.Redact(a.Spec.Git.Upstream),
		GitURL: host + "/" + a.Name, Members: nonNil(a.Spec.Members), Domains: nonNil(a.Spec.Domains),
		Processes: processesOf(a), Conditions: []Condition{}, Created: a.CreationTimestamp.UTC()}
	for _, c := range a.Status.Conditions {
		in.Conditions = append(in.Conditions, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
	}
	in.Trouble, in.TroubleMessage = trouble(a)
	in.Cron = cronOf(a, time.Now())
	in.Databases = nonNil(appv1.LinkedDatabases(a.Spec.Env))
	return in
}

func processesOf(a *appv1.App) []ProcessInfo {
	out := []ProcessInfo{}
	for _, name := range slices.Sorted(maps.Keys(a.Spec.Processes)) {
		p := a.Spec.Processes[name]
		at := a.Annotations[appv1.RestartedAtAnnotation+"."+name]
		if all := a.Annotations[appv1.RestartedAtAnnotation]; all > at {
			at = all
		}
		out = append(out, ProcessInfo{Type: name, Command: nonNil(p.Command), Replicas: p.Replicas, RestartedAt: at, Resources: resourcesOf(p)})
	}
	return out
}

// resourcesOf is the ResourceInfo of p.
func resourcesOf(p appv1.ProcessSpec) ResourceInfo {
	ri := ResourceInfo{MemoryBytes: p.MemoryBytes(), Default: p.Resources == nil || (p.Resources.Memory == nil && p.Resources.CPU == nil)}
	ri.Memory = resource.NewQuantity(ri.MemoryBytes, resource.BinarySI).String()
	if m := p.CPUMillis(); m > 0 {
		ri.CPU = resource.NewMilliQuantity(m, resource.DecimalSI).String()
	}
	return ri
}

func releaseInfoOf(r *appv1.Release, a *appv1.App) ReleaseInfo {
	return ReleaseInfo{Number: r.Spec.Number, Cause: string(r.Spec.Cause), Actor: r.Spec.Actor, Description: r.Spec.Description,
		Image: r.Spec.Image, Commit: r.Spec.Commit, Delivery: r.Spec.Delivery, RollbackOf: r.Spec.RollbackOf,
		Created: r.CreationTimestamp.UTC(), Current: r.Spec.Number == a.Spec.Release, Serving: r.Spec.Number == a.Status.Revision,
		Failed: r.Annotations[appv1.AnnotationReleaseFailed]}
}

func configVarOf(e appv1.EnvVar) ConfigVar {
	if e.ValueFrom != nil {
		return ConfigVar{Name: e.Name, Secret: &SecretRef{Name: e.ValueFrom.Name, Key: e.ValueFrom.Key}}
	}
	v := e.Value
	return ConfigVar{Name: e.Name, Value: &v}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
