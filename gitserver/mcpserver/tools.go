package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
	"bex.co/bex/internal/appops"
)

// AppArg names an app.
type AppArg struct {
	App string `json:"app" jsonschema:"the app's name"`
}

// AppSummary is one app of list_apps.
type AppSummary struct {
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Revision  int64  `json:"revision" jsonschema:"the release that serves now (0: none)"`
	URL       string `json:"url"`
	Suspended bool   `json:"suspended"`
}

// AppList is list_apps' result.
type AppList struct {
	Apps []AppSummary `json:"apps"`
}

// Condition is one status condition.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Process is one process type.
type Process struct {
	Type      string              `json:"type"`
	Command   []string            `json:"command"`
	Replicas  int32               `json:"replicas"`
	Resources appops.ResourceInfo `json:"resources" jsonschema:"the limits of each instance: memory (over it the instance is killed, reason OOMKilled, and restarted) and CPUs (empty: no cap)"`
}

// BuildResult is an app's last build.
type BuildResult struct {
	ID     string    `json:"id"`
	Commit string    `json:"commit"`
	Time   time.Time `json:"time"`
	Result string    `json:"result" jsonschema:"succeeded, failed, or running (the log has no end yet)"`
}

// ReleaseInfo is one release.
type ReleaseInfo struct {
	Number      int64     `json:"number"`
	Cause       string    `json:"cause"`
	Actor       string    `json:"actor"`
	Description string    `json:"description"`
	Commit      string    `json:"commit"`
	Image       string    `json:"image"`
	Delivery    string    `json:"delivery,omitempty"`
	RollbackOf  int64     `json:"rollbackOf,omitempty"`
	Created     time.Time `json:"created"`
	Serving     bool      `json:"serving"`
	Failed      string    `json:"failed,omitempty" jsonschema:"why the release never served, when it did not"`
}

// AppStatus is app_status' result.
type AppStatus struct {
	Name         string       `json:"name"`
	Phase        string       `json:"phase" jsonschema:"Pending, Building, Deploying, Running, Failed or Suspended"`
	Release      int64        `json:"release" jsonschema:"the release the app asks for"`
	Revision     int64        `json:"revision" jsonschema:"the release that serves now"`
	URL          string       `json:"url"`
	Suspended    bool         `json:"suspended"`
	DeployBranch string       `json:"deployBranch"`
	Upstream     string       `json:"upstream,omitempty"`
	Processes    []Process    `json:"processes"`
	Conditions   []Condition  `json:"conditions"`
	LastBuild    *BuildResult `json:"lastBuild,omitempty"`
	LastRelease  *ReleaseInfo `json:"lastRelease,omitempty"`
}

// DeployArgs are deploy's arguments.
type DeployArgs struct {
	App    string `json:"app" jsonschema:"the app's name"`
	Commit string `json:"commit,omitempty" jsonschema:"a full 40-digit commit of the app's repository; default: the deploy branch (fetched from the upstream when the app has one)"`
}

// Deployed is the result of deploy, rollback and set_config.
type Deployed struct {
	App        string `json:"app"`
	Release    int64  `json:"release" jsonschema:"the new release (0: nothing released; config kept for the first deploy)"`
	Commit     string `json:"commit,omitempty"`
	RollbackOf int64  `json:"rollbackOf,omitempty"`
	URL        string `json:"url,omitempty"`
}

// RollbackArgs are rollback's arguments.
type RollbackArgs struct {
	App string `json:"app" jsonschema:"the app's name"`
	To  int64  `json:"to,omitempty" jsonschema:"the release to bring back; default: the newest one before the current that served"`
}

// Suspension is the result of suspend and resume.
type Suspension struct {
	App       string `json:"app"`
	Suspended bool   `json:"suspended"`
}

// ConfigArgs are set_config's arguments.
type ConfigArgs struct {
	App   string            `json:"app" jsonschema:"the app's name"`
	Set   map[string]string `json:"set,omitempty" jsonschema:"config vars to set, name to value"`
	Unset []string          `json:"unset,omitempty" jsonschema:"config vars to remove"`
}

// ScaleArgs are scale's arguments.
type ScaleArgs struct {
	App       string           `json:"app" jsonschema:"the app's name"`
	Processes map[string]int32 `json:"processes" jsonschema:"process type to replicas (0 to 100)"`
}

// Scaled is scale's result.
type Scaled struct {
	App       string    `json:"app"`
	Processes []Process `json:"processes"`
}

// ReleasesArgs are releases' arguments.
type ReleasesArgs struct {
	App   string `json:"app" jsonschema:"the app's name"`
	Limit int    `json:"limit,omitempty" jsonschema:"how many, newest first (default 20)"`
}

// ReleaseList is releases' result.
type ReleaseList struct {
	App      string        `json:"app"`
	Releases []ReleaseInfo `json:"releases"`
}

// LogsArgs are logs' arguments.
type LogsArgs struct {
	App     string `json:"app" jsonschema:"the app's name"`
	Lines   int    `json:"lines,omitempty" jsonschema:"recent lines of each instance (default 100, at most 1000)"`
	Process string `json:"process,omitempty" jsonschema:"only this process type"`
}

// LogTail is the result of logs and build_logs.
type LogTail struct {
	App string `json:"app"`
	// Build and Commit name the build, for build_logs.
	Build  string `json:"build,omitempty"`
	Commit string `json:"commit,omitempty"`
	Log    string `json:"log"`
	// Truncated says the beginning was cut to keep the tail within bounds.
	Truncated bool `json:"truncated"`
}

// BuildLogsArgs are build_logs' arguments.
type BuildLogsArgs struct {
	App   string `json:"app" jsonschema:"the app's name"`
	Build string `json:"build,omitempty" jsonschema:"a build id from app_status; default: the latest build"`
}

func (s *Server) audit(u *gitserver.User, tool, app string, attrs ...any) {
	s.log.Info("audit", append([]any{"user", u.Name, "key", u.KeyName, "tool", tool, "app", app}, attrs...)...)
}

func phase(a *appv1.App) string {
	if a.Status.Phase == "" {
		return string(appv1.AppPhasePending)
	}
	return string(a.Status.Phase)
}

func processes(a *appv1.App) []Process {
	out := []Process{}
	for _, t := range appops.SortedKeys(a.Spec.Processes) {
		p := a.Spec.Processes[t]
		cmd := p.Command
		if cmd == nil {
			cmd = []string{}
		}
		out = append(out, Process{Type: t, Command: cmd, Replicas: p.Replicas, Resources: appops.ResourcesOf(p)})
	}
	return out
}

func releaseInfo(r appv1.Release, serving int64) ReleaseInfo {
	return ReleaseInfo{Number: r.Spec.Number, Cause: string(r.Spec.Cause), Actor: r.Spec.Actor, Description: r.Spec.Description,
		Commit: r.Spec.Commit, Image: r.Spec.Image, Delivery: r.Spec.Delivery, RollbackOf: r.Spec.RollbackOf,
		Created: r.CreationTimestamp.UTC(), Serving: r.Spec.Number == serving, Failed: r.Annotations[releases.AnnotationFailed]}
}

func required(app string) error {
	if app == "" {
		return appops.Fail(appops.Invalid, "the argument app is required")
	}
	return nil
}

func (s *Server) tools() {
	ops := s.cfg.Ops
	addTool(s, "list_apps", "List the apps you may use, with their phase, serving release and URL.",
		func(ctx context.Context, u *gitserver.User, _ struct{}) (AppList, string, error) {
			apps, err := ops.Apps(ctx, u)
			if err != nil {
				return AppList{}, "", err
			}
			out := AppList{Apps: []AppSummary{}}
			var names []string
			for _, a := range apps {
				out.Apps = append(out.Apps, AppSummary{Name: a.Name, Phase: phase(&a), Revision: a.Status.Revision, URL: a.Status.URL, Suspended: a.Spec.Suspended})
				names = append(names, fmt.Sprintf("%s (%s)", a.Name, phase(&a)))
			}
			if len(names) == 0 {
				return out, "You may use no apps.", nil
			}
			return out, fmt.Sprintf("%d apps: %s.", len(names), strings.Join(names, ", ")), nil
		})

	addTool(s, "app_status", "Show an app: phase, the release asked for and the one serving, URL, conditions, processes, the last build's result and the last release.",
		func(ctx context.Context, u *gitserver.User, in AppArg) (AppStatus, string, error) {
			if err := required(in.App); err != nil {
				return AppStatus{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return AppStatus{}, "", err
			}
			st := AppStatus{Name: a.Name, Phase: phase(a), Release: a.Spec.Release, Revision: a.Status.Revision, URL: a.Status.URL,
				Suspended: a.Spec.Suspended, DeployBranch: a.Spec.Git.DeployBranch, Upstream: a.Spec.Git.Upstream,
				Processes: processes(a), Conditions: []Condition{}}
			if st.DeployBranch == "" {
				st.DeployBranch = appv1.DefaultDeployBranch
			}
			for _, c := range a.Status.Conditions {
				st.Conditions = append(st.Conditions, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
			}
			if rels, err := ops.Releases.List(ctx, a.Name); err == nil && len(rels) > 0 {
				ri := releaseInfo(rels[0], a.Status.Revision)
				st.LastRelease = &ri
			}
			if s.cfg.Builds != nil {
				if builds, err := s.cfg.Builds.List(a.Name); err == nil && len(builds) > 0 {
					b := builds[0]
					st.LastBuild = &BuildResult{ID: b.ID, Commit: b.Commit, Time: b.Time.UTC(), Result: s.buildResult(a.Name, b.ID)}
				}
			}
			text := fmt.Sprintf("%s is %s", a.Name, st.Phase)
			if st.Revision > 0 {
				text += fmt.Sprintf(", serving release v%d at %s", st.Revision, st.URL)
			}
			if st.Release != st.Revision && st.Release > 0 {
				text += fmt.Sprintf("; it asks for v%d", st.Release)
			}
			if c := meta.FindStatusCondition(a.Status.Conditions, appv1.RolledOutCondition); c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
				text += "; rollout: " + c.Message
			}
			if st.LastBuild != nil {
				text += fmt.Sprintf("; last build %s of %.7s", st.LastBuild.Result, st.LastBuild.Commit)
			}
			return st, text + ".", nil
		})

	addTool(s, "deploy", "Rebuild and roll out an app: its deploy branch (fetched from its upstream when it has one) or a given commit. Waits until the release serves or fails; the previous release keeps serving on failure.",
		func(ctx context.Context, u *gitserver.User, in DeployArgs) (Deployed, string, error) {
			if err := required(in.App); err != nil {
				return Deployed{}, "", err
			}
			if _, err := ops.App(ctx, u, in.App); err != nil {
				return Deployed{}, "", err
			}
			if s.cfg.Deployer == nil {
				return Deployed{}, "", appops.Fail(appops.Invalid, "this server does not build")
			}
			s.audit(u, "deploy", in.App, "commit", in.Commit)
			res, err := s.cfg.Deployer.Deploy(ctx, in.App, in.Commit, u.Name)
			switch {
			case errors.Is(err, gitserver.ErrAppNotFound):
				return Deployed{}, "", appops.Fail(appops.NotFound, "no app %q", in.App)
			case errors.Is(err, gitserver.ErrNothingToDeploy):
				return Deployed{}, "", appops.Fail(appops.Invalid, "%v", err)
			case errors.Is(err, gitserver.ErrBusy):
				return Deployed{}, "", appops.Fail(appops.Conflict, "%v: try again once it ends", err)
			case errors.Is(err, gitserver.ErrDeployFailed):
				return Deployed{}, "", appops.Fail(appops.Failed, "%v; the previous release keeps serving (build_logs shows the build)", err)
			case err != nil:
				return Deployed{}, "", err
			}
			return Deployed{App: in.App, Release: res.Release, Commit: res.Commit, URL: res.URL},
				fmt.Sprintf("Deployed %s: release v%d of commit %.7s serves at %s.", in.App, res.Release, res.Commit, res.URL), nil
		})

	addTool(s, "rollback", "Run an older release's image and config again, as a new release, and wait for it to serve.",
		func(ctx context.Context, u *gitserver.User, in RollbackArgs) (Deployed, string, error) {
			if err := required(in.App); err != nil {
				return Deployed{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return Deployed{}, "", err
			}
			to, err := ops.RollbackTarget(ctx, a, in.To)
			if err != nil {
				return Deployed{}, "", err
			}
			n, err := ops.Releases.Rollback(ctx, a.Name, to, u.Name)
			if err != nil {
				return Deployed{}, "", fmt.Errorf("recording the rollback of %s: %w", a.Name, err)
			}
			s.audit(u, "rollback", a.Name, "to", to, "release", n)
			url, err := ops.Await(ctx, a.Name, n, s.cfg.RolloutTimeout, nil)
			if err != nil {
				return Deployed{}, "", err
			}
			return Deployed{App: a.Name, Release: n, RollbackOf: to, URL: url},
				fmt.Sprintf("Rolled %s back to v%d: release v%d serves at %s.", a.Name, to, n, url), nil
		})

	suspend := func(suspended bool) handler[AppArg, Suspension] {
		return func(ctx context.Context, u *gitserver.User, in AppArg) (Suspension, string, error) {
			if err := required(in.App); err != nil {
				return Suspension{}, "", err
			}
			if err := ops.SetSuspended(ctx, u, in.App, suspended); err != nil {
				return Suspension{}, "", err
			}
			if suspended {
				s.audit(u, "suspend", in.App)
				return Suspension{App: in.App, Suspended: true}, fmt.Sprintf("Suspended %s: its processes stop and the edge answers 503.", in.App), nil
			}
			s.audit(u, "resume", in.App)
			return Suspension{App: in.App}, fmt.Sprintf("Resumed %s: its processes start again on the same release.", in.App), nil
		}
	}
	addTool(s, "suspend", "Stop every process of an app; the edge answers 503 until resume.", suspend(true))
	addTool(s, "resume", "Start a suspended app again, on the same release.", suspend(false))

	addTool(s, "set_config", "Set and unset config vars: one release, then wait for it to serve.",
		func(ctx context.Context, u *gitserver.User, in ConfigArgs) (Deployed, string, error) {
			if err := required(in.App); err != nil {
				return Deployed{}, "", err
			}
			if len(in.Set) == 0 && len(in.Unset) == 0 {
				return Deployed{}, "", appops.Fail(appops.Invalid, "nothing to change: give set or unset")
			}
			names := appops.SortedKeys(in.Set)
			for _, k := range append(slices.Clone(names), in.Unset...) {
				if err := appops.CheckEnvName(k); err != nil {
					return Deployed{}, "", err
				}
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return Deployed{}, "", err
			}
			edit := func(env []appv1.EnvVar) []appv1.EnvVar {
				env = slices.DeleteFunc(env, func(e appv1.EnvVar) bool { return slices.Contains(in.Unset, e.Name) })
				for _, k := range names {
					if i := slices.IndexFunc(env, func(e appv1.EnvVar) bool { return e.Name == k }); i >= 0 {
						env[i] = appv1.EnvVar{Name: k, Value: in.Set[k]}
					} else {
						env = append(env, appv1.EnvVar{Name: k, Value: in.Set[k]})
					}
				}
				return env
			}
			var parts []string
			if len(names) > 0 {
				parts = append(parts, "Set "+strings.Join(names, ", "))
			}
			if len(in.Unset) > 0 {
				parts = append(parts, "Unset "+strings.Join(in.Unset, ", "))
			}
			desc := strings.Join(parts, "; ")
			n, err := ops.ChangeConfig(ctx, u, a, edit, desc)
			if err != nil {
				return Deployed{}, "", err
			}
			s.audit(u, "set_config", a.Name, "set", names, "unset", in.Unset, "release", n)
			if n == 0 {
				return Deployed{App: a.Name}, fmt.Sprintf("%s on %s; its first deploy takes it.", desc, a.Name), nil
			}
			url, err := ops.Await(ctx, a.Name, n, s.cfg.RolloutTimeout, nil)
			if err != nil {
				return Deployed{}, "", err
			}
			return Deployed{App: a.Name, Release: n, URL: url}, fmt.Sprintf("%s on %s: release v%d serves at %s.", desc, a.Name, n, url), nil
		})

	addTool(s, "scale", "Set how many instances of each process type run (no new release).",
		func(ctx context.Context, u *gitserver.User, in ScaleArgs) (Scaled, string, error) {
			if err := required(in.App); err != nil {
				return Scaled{}, "", err
			}
			if len(in.Processes) == 0 {
				return Scaled{}, "", appops.Fail(appops.Invalid, "nothing to scale: give processes, e.g. {\"web\": 2}")
			}
			order := appops.SortedKeys(in.Processes)
			if err := ops.Scale(ctx, u, in.App, order, in.Processes); err != nil {
				return Scaled{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return Scaled{}, "", err
			}
			var parts []string
			for _, t := range order {
				parts = append(parts, fmt.Sprintf("%s=%d", t, in.Processes[t]))
			}
			s.audit(u, "scale", in.App, "scale", strings.Join(parts, " "))
			return Scaled{App: in.App, Processes: processes(a)}, fmt.Sprintf("Scaled %s to %s.", in.App, strings.Join(parts, ", ")), nil
		})

	addTool(s, "releases", "List an app's releases, newest first: cause, who, commit, which serves, which failed.",
		func(ctx context.Context, u *gitserver.User, in ReleasesArgs) (ReleaseList, string, error) {
			if err := required(in.App); err != nil {
				return ReleaseList{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return ReleaseList{}, "", err
			}
			rels, err := ops.Releases.List(ctx, a.Name)
			if err != nil {
				return ReleaseList{}, "", err
			}
			limit := in.Limit
			if limit <= 0 {
				limit = 20
			}
			out := ReleaseList{App: a.Name, Releases: []ReleaseInfo{}}
			for _, r := range rels[:min(limit, len(rels))] {
				out.Releases = append(out.Releases, releaseInfo(r, a.Status.Revision))
			}
			if len(out.Releases) == 0 {
				return out, fmt.Sprintf("%s has no releases yet.", a.Name), nil
			}
			return out, fmt.Sprintf("%s has %d releases; the newest is v%d (%s), v%d serves.", a.Name, len(rels), rels[0].Spec.Number, rels[0].Spec.Description, a.Status.Revision), nil
		})

	addTool(s, "logs", "The recent lines the app's processes printed (a bounded tail; no following).",
		func(ctx context.Context, u *gitserver.User, in LogsArgs) (LogTail, string, error) {
			if err := required(in.App); err != nil {
				return LogTail{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return LogTail{}, "", err
			}
			if in.Process != "" {
				if _, ok := a.Spec.Processes[in.Process]; !ok {
					return LogTail{}, "", appops.Fail(appops.Invalid, "%s has no process type %q: its types are %v", a.Name, in.Process, appops.SortedKeys(a.Spec.Processes))
				}
			}
			if s.cfg.Logs == nil {
				return LogTail{}, "", appops.Fail(appops.Invalid, "this server cannot read runtime logs")
			}
			lines := in.Lines
			if lines <= 0 {
				lines = 100
			}
			lines = min(lines, 1000)
			var buf tailBuffer
			buf.max = s.cfg.MaxLogBytes
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := s.cfg.Logs.Tail(lctx, a.Name, in.Process, lines, &buf); err != nil {
				return LogTail{}, "", appops.Fail(appops.Invalid, "%v", err)
			}
			out := LogTail{App: a.Name, Log: buf.String(), Truncated: buf.cut}
			return out, fmt.Sprintf("%d log lines of %s.", strings.Count(out.Log, "\n"), a.Name), nil
		})

	addTool(s, "build_logs", "The output of one of an app's builds (default: the latest), its tail when long.",
		func(ctx context.Context, u *gitserver.User, in BuildLogsArgs) (LogTail, string, error) {
			if err := required(in.App); err != nil {
				return LogTail{}, "", err
			}
			a, err := ops.App(ctx, u, in.App)
			if err != nil {
				return LogTail{}, "", err
			}
			if s.cfg.Builds == nil {
				return LogTail{}, "", appops.Fail(appops.Invalid, "this server keeps no build logs")
			}
			builds, err := s.cfg.Builds.List(a.Name)
			if err != nil {
				return LogTail{}, "", err
			}
			if len(builds) == 0 {
				return LogTail{}, "", appops.Fail(appops.NotFound, "%s has no builds yet", a.Name)
			}
			b := builds[0]
			if in.Build != "" {
				i := slices.IndexFunc(builds, func(x Build) bool { return x.ID == in.Build })
				if i < 0 {
					return LogTail{}, "", appops.Fail(appops.NotFound, "%s has no build %q (app_status names the latest)", a.Name, in.Build)
				}
				b = builds[i]
			}
			f, err := s.cfg.Builds.Open(a.Name, b.ID)
			if errors.Is(err, fs.ErrNotExist) {
				return LogTail{}, "", appops.Fail(appops.NotFound, "%s has no build %q", a.Name, b.ID)
			}
			if err != nil {
				return LogTail{}, "", err
			}
			defer f.Close()
			buf := tailBuffer{max: s.cfg.MaxLogBytes}
			if _, err := io.Copy(&buf, f); err != nil {
				return LogTail{}, "", err
			}
			out := LogTail{App: a.Name, Build: b.ID, Commit: b.Commit, Log: buf.String(), Truncated: buf.cut}
			return out, fmt.Sprintf("Build %s of %s (commit %.7s): %s.", b.ID, a.Name, b.Commit, resultOf(out.Log)), nil
		})
}

// buildResult reads the end of a build's log for how it ended.
func (s *Server) buildResult(app, id string) string {
	f, err := s.cfg.Builds.Open(app, id)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	buf := tailBuffer{max: 8 << 10}
	_, _ = io.Copy(&buf, f)
	return resultOf(buf.String())
}

// resultOf tells a build's end from its log: the builder's last step is
// "-----> Built <image>", a failure's lines start " !     ".
func resultOf(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	result := "running"
	for sc.Scan() {
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "-----> Built "):
			result = "succeeded"
		case strings.HasPrefix(line, " !     "):
			result = "failed"
		}
	}
	return result
}

// tailBuffer keeps the last max bytes written, cut at a line start.
type tailBuffer struct {
	max int
	b   []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.max {
		t.trim()
	}
	return len(p), nil
}

func (t *tailBuffer) trim() {
	if len(t.b) <= t.max {
		return
	}
	t.cut = true
	t.b = t.b[len(t.b)-t.max:]
	if i := bytes.IndexByte(t.b, '\n'); i >= 0 && i < len(t.b)-1 {
		t.b = t.b[i+1:]
	}
	t.b = slices.Clip(t.b)
}

func (t *tailBuffer) String() string {
	t.trim()
	return string(t.b)
}
