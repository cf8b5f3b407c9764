package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"bex.co/bex/gitserver/backend"
)

// The tools' arguments and results. Results that show bex's objects use the
// backend's view types, the same as the ssh commands' --json.

// AppArg names an app.
type AppArg struct {
	App string `json:"app" jsonschema:"the app's name"`
}

// ListArgs page a list sorted by name.
type ListArgs struct {
	After string `json:"after,omitempty" jsonschema:"the cursor: names after this one, as next of the previous page gives it; default: from the first"`
	Limit int    `json:"limit,omitempty" jsonschema:"how many (default 50, at most 200)"`
}

// AppList is list_apps' result.
type AppList struct {
	Apps []backend.AppSummary `json:"apps"`
	// Next is the cursor of the next page ("": none).
	Next string `json:"next,omitempty" jsonschema:"more remain: pass it as after for the next page; absent when this is the last"`
}

// DeployArgs are deploy's arguments.
type DeployArgs struct {
	App    string `json:"app" jsonschema:"the app's name"`
	Commit string `json:"commit,omitempty" jsonschema:"a full 40-digit commit of the app's repository; default: the deploy branch (fetched from the upstream when the app has one)"`
	Change
}

// DeployImageArgs are deploy_image's arguments.
type DeployImageArgs struct {
	App   string `json:"app" jsonschema:"the app's name"`
	Image string `json:"image" jsonschema:"the image, as docker pull takes it: a tag (ghcr.io/org/app:v1) or a digest (registry.example/app@sha256:...), from any registry"`
	Change
}

// RollbackArgs are rollback's arguments.
type RollbackArgs struct {
	App string `json:"app" jsonschema:"the app's name"`
	To  int64  `json:"to,omitempty" jsonschema:"the release to bring back; default: the newest one before the current that served"`
	Change
}

// SuspendArgs are suspend's and resume's arguments.
type SuspendArgs struct {
	App string `json:"app" jsonschema:"the app's name"`
	Change
}

// Suspension is suspend's and resume's result.
type Suspension struct {
	App       string `json:"app"`
	Suspended bool   `json:"suspended"`
	Planned
}

// ConfigArgs are set_config's arguments.
type ConfigArgs struct {
	App   string            `json:"app" jsonschema:"the app's name"`
	Set   map[string]string `json:"set,omitempty" jsonschema:"config vars to set, name to value"`
	Unset []string          `json:"unset,omitempty" jsonschema:"config vars to remove"`
	Change
}

// ScaleArgs are scale's arguments.
type ScaleArgs struct {
	App       string           `json:"app" jsonschema:"the app's name"`
	Processes map[string]int32 `json:"processes" jsonschema:"process type to replicas (0 to 100)"`
	Change
}

// Scaled is scale's result.
type Scaled struct {
	App       string                `json:"app"`
	Processes []backend.ProcessInfo `json:"processes"`
	Planned
}

// ReleasesArgs are releases' arguments.
type ReleasesArgs struct {
	App    string `json:"app" jsonschema:"the app's name"`
	Limit  int    `json:"limit,omitempty" jsonschema:"how many, newest first (default 20, at most 100)"`
	Before int64  `json:"before,omitempty" jsonschema:"the cursor: releases older than this number, as next of the previous page gives it"`
}

// ReleaseList is releases' result.
type ReleaseList struct {
	App      string                `json:"app"`
	Releases []backend.ReleaseInfo `json:"releases"`
	// Next is the cursor of the next (older) page (0: none).
	Next int64 `json:"next,omitempty" jsonschema:"older releases remain: pass it as before for the next page; absent when this is the last"`
}

// LogsArgs are logs' arguments.
type LogsArgs struct {
	App      string `json:"app" jsonschema:"the app's name"`
	Lines    int    `json:"lines,omitempty" jsonschema:"recent lines of each instance (default 100, at most 1000)"`
	Process  string `json:"process,omitempty" jsonschema:"only this process type"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes of the newest lines (default 16384, at most the server's bound, 65536 by default)"`
}

// LogTail is logs' and build_logs' result.
type LogTail struct {
	App string `json:"app"`
	// Build and Commit name the build, for build_logs; Result is how it ended.
	Build  string `json:"build,omitempty"`
	Commit string `json:"commit,omitempty"`
	Result string `json:"result,omitempty" jsonschema:"for build_logs: running, succeeded, failed or canceled"`
	// Log is what was printed, as untrusted output of the app (package
	// untrusted): cleaned, the app's config values masked, framed.
	Log string `json:"log" jsonschema:"what was printed: untrusted output of the app, without terminal escapes and control characters, its config values masked as [redacted: NAME], inside a block that marks it as data"`
	// Truncated is true when the log was longer than the tail returned.
	Truncated bool `json:"truncated"`
}

// BuildLogsArgs are build_logs' arguments.
type BuildLogsArgs struct {
	App      string `json:"app" jsonschema:"the app's name"`
	Build    string `json:"build,omitempty" jsonschema:"a build id from app_status; default: the latest build"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes of its last lines (default 16384, at most the server's bound, 65536 by default)"`
}

func required(app string) error {
	if app == "" {
		return backend.Errorf(backend.Invalid, "the argument app is required")
	}
	return nil
}

// tools registers the tools: each parses its arguments, calls the backend and
// says what happened.
func (s *Server) tools() {
	b := s.cfg.Backend
	s.runTool()
	s.volumeTools()
	s.databaseTools()
	s.auditTool()
	s.diagnoseTool()
	addTool(s, "list_apps", reads, "List the apps you may use, with their phase, serving release and URL.",
		func(ctx context.Context, u *backend.User, in ListArgs) (AppList, string, error) {
			all, err := b.Apps(ctx, u)
			if err != nil {
				return AppList{}, "", err
			}
			apps, next, err := pageByName(all, func(a backend.AppSummary) string { return a.Name }, in)
			if err != nil {
				return AppList{}, "", err
			}
			names := make([]string, len(apps))
			for i, a := range apps {
				names[i] = fmt.Sprintf("%s (%s)", a.Name, a.Phase)
			}
			if len(all) == 0 {
				return AppList{Apps: apps}, "You may use no apps.", nil
			}
			return AppList{Apps: apps, Next: next}, fmt.Sprintf("%d apps: %s.", len(names), strings.Join(names, ", ")) + cutNote(next, "after"), nil
		})

	addTool(s, "app_status", reads, "Show an app: phase, the release asked for and the one serving, URL, conditions, processes, cron jobs and their last runs (failing: 3 failed runs in a row), the databases linked to it, the last build's result and the last release."+tailNote,
		func(ctx context.Context, u *backend.User, in AppArg) (backend.AppInfo, string, error) {
			if err := required(in.App); err != nil {
				return backend.AppInfo{}, "", err
			}
			st, err := b.App(ctx, u, in.App)
			if err != nil {
				return backend.AppInfo{}, "", err
			}
			if err := s.maskStatus(ctx, u, st); err != nil {
				return backend.AppInfo{}, "", err
			}
			text := fmt.Sprintf("%s is %s", st.Name, st.Phase)
			if st.Revision > 0 {
				text += fmt.Sprintf(", serving release v%d at %s", st.Revision, st.URL)
			}
			if st.Release != st.Revision && st.Release > 0 {
				text += fmt.Sprintf("; it asks for v%d", st.Release)
			}
			if st.TroubleMessage != "" {
				text += "; rollout: " + st.TroubleMessage
			}
			if len(st.Cron) > 0 {
				text += fmt.Sprintf("; %d cron jobs", len(st.Cron))
			}
			for _, c := range st.Cron {
				if c.Failing {
					exit := "none"
					if c.LastExitCode != nil {
						exit = fmt.Sprint(*c.LastExitCode)
					}
					text += fmt.Sprintf("; cron job %s failing (%d runs in a row, last exit %s)", c.ID, c.ConsecutiveFailures, exit)
				}
			}
			if len(st.Databases) > 0 {
				text += "; linked to the databases " + strings.Join(st.Databases, ", ")
			}
			if lb := st.LastBuild; lb != nil {
				text += fmt.Sprintf("; last build %s of %.7s", lb.Result, lb.Commit)
				if lb.Error != "" {
					text += ": " + lb.Error
				}
			}
			return *st, text + ".", nil
		})

	addTool(s, "deploy", changes, "Rebuild and roll out an app: its deploy branch (fetched from its upstream when it has one) or a given commit. Waits until the release serves or fails; the previous release keeps serving on failure."+tailNote+verdictNote,
		func(ctx context.Context, u *backend.User, in DeployArgs) (Deployed, string, error) {
			began := time.Now()
			if err := required(in.App); err != nil {
				return s.change(ctx, u, "deploy", in.App, nil, began, Deployed{}, "", err)
			}
			res, err := b.Deploy(ctx, u, in.App, in.Commit)
			if err != nil {
				return s.change(ctx, u, "deploy", in.App, nil, began, Deployed{}, "", err)
			}
			return s.change(ctx, u, "deploy", in.App, nil, began, Deployed{Commit: res.Commit, Verdict: Verdict{Release: res.Release, URL: res.URL}},
				fmt.Sprintf("Deployed %s: release v%d of commit %.7s serves at %s.", in.App, res.Release, res.Commit, res.URL), nil)
		})

	addTool(s, "deploy_image", changes, "Deploy an image from a registry as a new release of an app (cause Image): it is pulled, pinned by its digest, and runs its own command as web, as deploy:image does. Waits until the release serves or fails; the previous release keeps serving on failure. A private registry needs an admin's registry:login."+tailNote+verdictNote,
		func(ctx context.Context, u *backend.User, in DeployImageArgs) (Deployed, string, error) {
			began := time.Now()
			if err := required(in.App); err != nil {
				return s.change(ctx, u, "deploy_image", in.App, nil, began, Deployed{}, "", err)
			}
			res, err := b.DeployImage(ctx, u, in.App, in.Image, nil)
			if err != nil {
				return s.change(ctx, u, "deploy_image", in.App, nil, began, Deployed{}, "", err)
			}
			return s.change(ctx, u, "deploy_image", in.App, nil, began, Deployed{Verdict: Verdict{Release: res.Release, URL: res.URL}},
				fmt.Sprintf("Deployed %s: release v%d of %s serves at %s.", in.App, res.Release, in.Image, res.URL), nil)
		})

	addTool(s, "rollback", changes, "Run an older release's image and config again, as a new release, and wait for it to serve."+tailNote+verdictNote,
		func(ctx context.Context, u *backend.User, in RollbackArgs) (Deployed, string, error) {
			began := time.Now()
			if err := required(in.App); err != nil {
				return s.change(ctx, u, "rollback", in.App, nil, began, Deployed{}, "", err)
			}
			to, n, err := b.Rollback(ctx, u, in.App, in.To)
			if err != nil {
				return s.change(ctx, u, "rollback", in.App, nil, began, Deployed{}, "", err)
			}
			url, err := b.Await(ctx, in.App, n, nil)
			if err != nil {
				return s.change(ctx, u, "rollback", in.App, nil, began, Deployed{}, "", err)
			}
			return s.change(ctx, u, "rollback", in.App, nil, began, Deployed{RollbackOf: to, Verdict: Verdict{Release: n, URL: url}},
				fmt.Sprintf("Rolled %s back to v%d: release v%d serves at %s.", in.App, to, n, url), nil)
		})

	suspend := func(suspended bool) handler[SuspendArgs, Suspension] {
		return func(ctx context.Context, u *backend.User, in SuspendArgs) (Suspension, string, error) {
			if err := required(in.App); err != nil {
				return Suspension{}, "", err
			}
			if err := b.SetSuspended(ctx, u, in.App, suspended); err != nil {
				return Suspension{}, "", err
			}
			if suspended {
				return Suspension{App: in.App, Suspended: true}, fmt.Sprintf("Suspended %s: its processes stop and the edge answers 503.", in.App), nil
			}
			return Suspension{App: in.App}, fmt.Sprintf("Resumed %s: its processes start again on the same release.", in.App), nil
		}
	}
	addTool(s, "suspend", changes, "Stop every process of an app; the edge answers 503 until resume.", suspend(true))
	addTool(s, "resume", changes, "Start a suspended app again, on the same release.", suspend(false))

	addTool(s, "set_config", changes, "Set and unset config vars: one release, then wait for it to serve. The result names the vars; no tool shows a config value."+tailNote+verdictNote,
		func(ctx context.Context, u *backend.User, in ConfigArgs) (Deployed, string, error) {
			began := time.Now()
			if err := required(in.App); err != nil {
				return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{}, "", err)
			}
			ch := backend.ConfigChange{Unset: in.Unset}
			for _, k := range slices.Sorted(maps.Keys(in.Set)) {
				ch.Set = append(ch.Set, backend.EnvVar{Name: k, Value: in.Set[k]})
			}
			res, err := b.ChangeConfig(ctx, u, in.App, ch)
			if err != nil {
				return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{}, "", err)
			}
			switch {
			case res.Description == "":
				return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{}, fmt.Sprintf("Nothing to change on %s: %s not set.", in.App, strings.Join(res.NotSet, ", ")), nil)
			case res.Release == 0:
				return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{}, fmt.Sprintf("%s on %s; its first deploy takes it.", res.Description, in.App), nil)
			}
			url, err := b.Await(ctx, in.App, res.Release, nil)
			if err != nil {
				return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{}, "", err)
			}
			return s.change(ctx, u, "set_config", in.App, in.Set, began, Deployed{Verdict: Verdict{Release: res.Release, URL: url}},
				fmt.Sprintf("%s on %s: release v%d serves at %s.", res.Description, in.App, res.Release, url), nil)
		})

	addTool(s, "scale", changes, "Set how many instances of each process type run (no new release).",
		func(ctx context.Context, u *backend.User, in ScaleArgs) (Scaled, string, error) {
			if err := required(in.App); err != nil {
				return Scaled{}, "", err
			}
			order := slices.Sorted(maps.Keys(in.Processes))
			procs, err := b.Scale(ctx, u, in.App, order, in.Processes)
			if err != nil {
				return Scaled{}, "", err
			}
			parts := make([]string, len(order))
			for i, t := range order {
				parts[i] = fmt.Sprintf("%s=%d", t, in.Processes[t])
			}
			return Scaled{App: in.App, Processes: procs}, fmt.Sprintf("Scaled %s to %s.", in.App, strings.Join(parts, ", ")), nil
		})

	addTool(s, "releases", reads, "List an app's releases, newest first: cause, who, commit, which serves, which failed."+tailNote,
		func(ctx context.Context, u *backend.User, in ReleasesArgs) (ReleaseList, string, error) {
			if err := required(in.App); err != nil {
				return ReleaseList{}, "", err
			}
			limit := in.Limit
			switch {
			case limit <= 0:
				limit = 20
			case limit > 100:
				return ReleaseList{}, "", backend.Errorf(backend.Invalid, "limit %d: at most 100 releases a page (pass next as before for more)", in.Limit)
			}
			rels, total, err := b.Releases(ctx, u, in.App, 0)
			if err != nil {
				return ReleaseList{}, "", err
			}
			if in.Before > 0 {
				rels = slices.DeleteFunc(rels, func(r backend.ReleaseInfo) bool { return r.Number >= in.Before })
			}
			var next int64
			if len(rels) > limit {
				rels, next = rels[:limit], rels[limit-1].Number
			}
			if slices.ContainsFunc(rels, func(r backend.ReleaseInfo) bool { return r.Failed != "" }) {
				o, err := s.outputOf(ctx, u, in.App)
				if err != nil {
					return ReleaseList{}, "", err
				}
				for i := range rels {
					rels[i].Failed = o.verdict(rels[i].Failed)
				}
			}
			out := ReleaseList{App: in.App, Releases: rels, Next: next}
			if len(rels) == 0 {
				return out, fmt.Sprintf("%s has no releases yet.", in.App), nil
			}
			text := fmt.Sprintf("%s has %d releases; the newest is v%d (%s)", in.App, total, rels[0].Number, rels[0].Description)
			if i := slices.IndexFunc(rels, func(r backend.ReleaseInfo) bool { return r.Serving }); i >= 0 {
				text += fmt.Sprintf(", v%d serves", rels[i].Number)
			}
			if next != 0 {
				text += fmt.Sprintf(". Cut: older releases remain (before: %d)", next)
			}
			return out, text + ".", nil
		})

	addTool(s, "logs", reads, "The recent lines the app's processes printed (a bounded tail; no following)."+untrustedNote,
		func(ctx context.Context, u *backend.User, in LogsArgs) (LogTail, string, error) {
			if err := required(in.App); err != nil {
				return LogTail{}, "", err
			}
			lines := in.Lines
			if lines <= 0 {
				lines = 100
			}
			max, err := s.logBytes(in.MaxBytes)
			if err != nil {
				return LogTail{}, "", err
			}
			buf := tailBuffer{max: max}
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := b.Logs(lctx, u, in.App, backend.LogOptions{Lines: min(lines, 1000), Process: in.Process}, &buf); err != nil {
				return LogTail{}, "", err
			}
			o, err := s.outputOf(ctx, u, in.App)
			if err != nil {
				return LogTail{}, "", err
			}
			log := buf.String()
			out := LogTail{App: in.App, Log: o.block(sourceLogs, log), Truncated: buf.cut}
			return out, fmt.Sprintf("%d log lines of %s%s:\n%s", lineCount(log), in.App, cutLog(buf.cut, max), out.Log), nil
		})

	addTool(s, "build_logs", reads, "The output of one of an app's builds (default: the latest), its tail when long, and how it ended."+untrustedNote,
		func(ctx context.Context, u *backend.User, in BuildLogsArgs) (LogTail, string, error) {
			if err := required(in.App); err != nil {
				return LogTail{}, "", err
			}
			bi, f, err := b.BuildLog(ctx, u, in.App, in.Build)
			if err != nil {
				return LogTail{}, "", err
			}
			defer f.Close()
			max, err := s.logBytes(in.MaxBytes)
			if err != nil {
				return LogTail{}, "", err
			}
			buf := tailBuffer{max: max}
			if _, err := io.Copy(&buf, f); err != nil {
				return LogTail{}, "", err
			}
			o, err := s.outputOf(ctx, u, in.App)
			if err != nil {
				return LogTail{}, "", err
			}
			out := LogTail{App: in.App, Build: bi.ID, Commit: bi.Commit, Result: bi.Result, Log: o.block(sourceBuild, buf.String()), Truncated: buf.cut}
			text := fmt.Sprintf("Build %s of %s (commit %.7s): %s", bi.ID, in.App, bi.Commit, bi.Result)
			if bi.Error != "" {
				text += ": " + o.line(bi.Error)
			}
			return out, text + "." + cutLog(buf.cut, max) + "\n" + out.Log, nil
		})
}

// maskStatus makes the parts of st that may quote what the app printed (the
// RolledOut condition's message, a crash loop's last log lines; a failed
// release's reason; a failed build's headline, which names its step) fit for
// an agent.
func (s *Server) maskStatus(ctx context.Context, u *backend.User, st *backend.AppInfo) error {
	o, err := s.outputOf(ctx, u, st.Name)
	if err != nil {
		return err
	}
	st.TroubleMessage = o.verdict(st.TroubleMessage)
	for i := range st.Conditions {
		st.Conditions[i].Message = o.verdict(st.Conditions[i].Message)
	}
	if st.LastRelease != nil {
		st.LastRelease.Failed = o.verdict(st.LastRelease.Failed)
	}
	if st.LastBuild != nil {
		st.LastBuild.Error = o.line(st.LastBuild.Error)
	}
	return nil
}

// lineCount counts the lines of text, a last one without "\n" included.
func lineCount(text string) int {
	n := strings.Count(text, "\n")
	if text != "" && !strings.HasSuffix(text, "\n") {
		n++
	}
	return n
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

// The bounds of a page of a list by name.
const (
	defaultPage = 50
	maxPage     = 200
)

// pageByName is the page of items (sorted by name) that in asks for, and the
// cursor of the next one ("": none).
func pageByName[T any](items []T, name func(T) string, in ListArgs) ([]T, string, error) {
	limit := in.Limit
	switch {
	case limit <= 0:
		limit = defaultPage
	case limit > maxPage:
		return nil, "", backend.Errorf(backend.Invalid, "limit %d: at most %d a page (pass next as after for more)", in.Limit, maxPage)
	}
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(name(a), name(b)) })
	if in.After != "" {
		i, _ := slices.BinarySearchFunc(items, in.After, func(x T, after string) int { return strings.Compare(name(x), after) })
		for i < len(items) && name(items[i]) <= in.After {
			i++
		}
		items = items[i:]
	}
	if len(items) <= limit {
		return items, "", nil
	}
	return items[:limit], name(items[limit-1]), nil
}

// cutNote is what a page's text adds when more remain: the cursor and the
// argument that takes it.
func cutNote(next, arg string) string {
	if next == "" {
		return ""
	}
	return fmt.Sprintf(" Cut: more remain (%s: %q).", arg, next)
}

// defaultLogBytes is what logs and build_logs return of a log by default: a
// tail an agent can read whole (about 4,000 tokens).
const defaultLogBytes = 16 << 10

// logBytes is the bound of a log tool's answer: asked (0: the default),
// within the server's MaxLogBytes.
func (s *Server) logBytes(asked int) (int, error) {
	switch {
	case asked == 0:
		return min(defaultLogBytes, s.cfg.MaxLogBytes), nil
	case asked < 1024 || asked > s.cfg.MaxLogBytes:
		return 0, backend.Errorf(backend.Invalid, "max_bytes %d: from 1024 to %d", asked, s.cfg.MaxLogBytes)
	}
	return asked, nil
}

// cutLog is what a log's text adds when its first lines were cut.
func cutLog(cut bool, max int) string {
	if !cut {
		return ""
	}
	return fmt.Sprintf(" (cut: the last %d bytes only; ask for more with max_bytes)", max)
}
