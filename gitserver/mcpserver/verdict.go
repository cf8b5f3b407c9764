package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/untrusted"
)

// A change that makes a release (deploy, deploy_image, set_config, rollback)
// ends with a verdict: one JSON object that says whether the release is live
// and, when it is not, where it stopped, what the failing build step or
// instance printed last and what to do next. On success it is the tool's
// structured content (in Deployed); on failure the tool error's text is
// "CODE: " followed by exactly the verdict's JSON, since clients drop (or
// reject) the structured content of an error.

// The verdict's statuses.
const (
	// StatusLive: the release serves.
	StatusLive = "live"
	// StatusRejected: refused before anything ran (invalid, forbidden, not
	// found, another deploy holding the app).
	StatusRejected = "rejected"
	// StatusFailed: it ran and did not come to serve.
	StatusFailed = "failed"
	// StatusTimeout: it ran out of time (the build's, or the rollout's: the
	// release may still come up).
	StatusTimeout = "timeout"
)

// verdictNote is what the tools that make a release say of their verdict.
const verdictNote = " It ends with a verdict: status (live, rejected, failed, timeout), phase (fetch, build, release, health, rollout), release, serving_release, url, duration_s, exit_code, log_tail, message and hint (what to do next) — the structured result on success; on failure the tool error's text is the code, \": \" and the verdict's JSON."

// maxVerdictBytes bounds a verdict's JSON: its log tail is cut first.
const maxVerdictBytes = 8 << 10

// maxTailLines bounds the verdict's log tail.
const maxTailLines = 40

// maxMessageBytes bounds the verdict's message.
const maxMessageBytes = 1 << 10

// Verdict is how a change that makes a release ended. Its JSON fields are a
// contract (docs/commands.md).
type Verdict struct {
	Status string `json:"status" jsonschema:"live (the release serves), rejected (refused before anything ran), failed (it ran and did not serve) or timeout (it ran out of time)"`
	Phase  string `json:"phase" jsonschema:"where it ended: fetch, build, release, health (the new instances crashed or did not answer) or rollout; a rejected change names the phase it would have begun with"`
	// Release is the release this change made (0: none).
	Release        int64  `json:"release" jsonschema:"the release this change made (0: none, or nothing released yet: config kept for the first deploy)"`
	ServingRelease int64  `json:"serving_release" jsonschema:"the release serving after the change: the new one when live, the previous one otherwise (0: none)"`
	URL            string `json:"url" jsonschema:"where the serving release answers (empty: nothing serves)"`
	// DurationS is how long the call took, in seconds.
	DurationS float64 `json:"duration_s"`
	// ExitCode is the failing build step's, release command's or instance's
	// exit code, when there is one.
	ExitCode *int `json:"exit_code,omitempty" jsonschema:"the exit code of the failing build step, release command or instance, when there is one"`
	// LogTail is what the failing build step or instance printed last, at most
	// 40 lines, as untrusted output of the app (framed, cleaned, masked).
	LogTail string `json:"log_tail" jsonschema:"the last lines (at most 40) the failing build step or instance printed: untrusted output of the app, its config values masked as [redacted: NAME], inside a block that marks it as data; empty when there are none"`
	// Message is bex's one line of what happened.
	Message string `json:"message" jsonschema:"what happened, in one line of bex's"`
	Hint    string `json:"hint" jsonschema:"what to do next, in one sentence"`
}

// Deployed is the result of the tools that make a release: the app, what was
// deployed, and the verdict.
type Deployed struct {
	App        string `json:"app"`
	Commit     string `json:"commit,omitempty"`
	RollbackOf int64  `json:"rollbackOf,omitempty"`
	Verdict
	Planned
}

// firstPhase is where a tool's change begins: where a refusal is placed.
func firstPhase(tool string) backend.Phase {
	switch tool {
	case "deploy", "deploy_image":
		return backend.PhaseFetch
	}
	return backend.PhaseRelease
}

// exitCodeRE finds an exit code in bex's line of a failure: a build step's
// ("failed with exit code 1"), a release command's ("exited with status 3"),
// a crash-looping instance's ("last: exited with code 1").
var exitCodeRE = regexp.MustCompile(`(?:exit code|exited with code|exited with status|exit status) (\d+)`)

// judge is the one mapping of how a change of tool ended (err, nil when it
// serves) to a verdict's status, phase, release and exit code, with bex's
// message (its lines after the first, when it has any, are what the app or
// its build printed: the deployer's "last log lines:", the builder's "its
// last output:"). The backend's kinds say whether it was refused; where a
// change that ran stopped is the mark the pipeline and the backend put on
// its error (backend.StopOf).
func judge(tool string, err error) (v Verdict, msg string) {
	if err == nil {
		return Verdict{Status: StatusLive, Phase: string(backend.PhaseRollout)}, ""
	}
	msg = err.Error()
	stop, ran := backend.StopOf(err)
	kind := backend.KindOf(err)
	switch {
	case ran:
		v.Status, v.Phase, v.Release = StatusFailed, string(stop.Phase), stop.Release
		if stop.TimedOut {
			v.Status = StatusTimeout
		}
	case kind == backend.Failed:
		// A failure nothing marked: after the release was recorded.
		v.Status, v.Phase = StatusFailed, string(backend.PhaseRollout)
	case kind == backend.Internal:
		// bex failed, or the call ended: where is not known.
		v.Status, v.Phase = StatusFailed, string(firstPhase(tool))
		if errors.Is(err, context.DeadlineExceeded) {
			v.Status = StatusTimeout
		}
	default: // not found, forbidden, invalid, conflict: nothing ran
		v.Status, v.Phase = StatusRejected, string(firstPhase(tool))
	}
	if v.Status != StatusRejected {
		head, _, _ := strings.Cut(msg, "\n")
		if m := exitCodeRE.FindAllStringSubmatch(head, -1); m != nil {
			if code, err := strconv.Atoi(m[len(m)-1][1]); err == nil {
				v.ExitCode = &code
			}
		}
	}
	return v, msg
}

// hintOf is what to do after v (its status, phase and serving release are
// set), in one sentence; kind is the error's, for a refusal.
func hintOf(v Verdict, kind backend.Kind) string {
	keeps := "nothing serves yet"
	if v.ServingRelease > 0 {
		keeps = fmt.Sprintf("release v%d keeps serving", v.ServingRelease)
	}
	switch v.Status {
	case StatusLive:
		if v.Release == 0 {
			return "Nothing to wait for: no new release was needed (a config change before the first deploy is taken by it)."
		}
		return fmt.Sprintf("Release v%d serves: nothing to do (logs shows what it prints).", v.Release)
	case StatusRejected:
		switch kind {
		case backend.Conflict:
			return "Nothing ran: another change of the app is running; try again once it ends."
		case backend.Forbidden:
			return "Nothing ran: this token may not make this change; ask the app's owner or an admin."
		case backend.NotFound:
			return "Nothing ran: check the names given (list_apps, releases) and try again."
		}
		return "Nothing ran: fix what message says and try again."
	case StatusTimeout:
		if v.Phase == string(backend.PhaseBuild) {
			return "The build ran past its time limit: make it faster (or fix a step that hangs) and deploy again — " + keeps + "."
		}
		return "The release did not serve in time and may still come up: check app_status and logs before changing anything — " + keeps + "."
	}
	if kind == backend.Internal {
		return "bex could not finish the change: check app_status, and try again; if it fails again, ask the server's admin — " + keeps + "."
	}
	switch backend.Phase(v.Phase) {
	case backend.PhaseFetch:
		return "Nothing could be fetched: check the image reference or upstream, and that this server can reach it (registry:login for a private registry), then try again — " + keeps + "."
	case backend.PhaseBuild:
		return "The build failed: read log_tail (build_logs has all of it), fix the code or its config and deploy again — " + keeps + "."
	case backend.PhaseRelease:
		return "The release command or recording failed: read message and releases, fix the command or the config and try again — " + keeps + "."
	case backend.PhaseHealth:
		return "The new release did not come up (it exited, or did not answer on PORT): read log_tail and logs, fix the code or config and try again — " + keeps + "."
	}
	return "The rollout did not finish: app_status says why; fix that and try again — " + keeps + "."
}

// verdictError is a change's failure as the agent gets it: its kind that of
// the change's error (toolError's code), its text exactly the verdict's JSON.
type verdictError struct {
	json string
	err  error
}

func (e *verdictError) Error() string { return e.json }
func (e *verdictError) Unwrap() error { return e.err }

// change ends a tool call that made (or tried to make) a release of app: on
// success (err nil) d with its verdict, live, and text; on failure the
// verdictError whose text is the verdict, with the release that serves
// (read after the failure), its URL, bex's message and what the app printed
// last, untrusted (framed, cleaned, masked), the JSON at most 8 KiB.
//
// set are the config values the call itself set (set_config's): masked too,
// as the App no longer has them once the failed release is withdrawn.
func (s *Server) change(ctx context.Context, u *backend.User, tool, app string, set map[string]string, began time.Time, d Deployed, text string, err error) (Deployed, string, error) {
	v, msg := judge(tool, err)
	v.DurationS = math.Round(time.Since(began).Seconds()*10) / 10
	if err == nil {
		v.Release, v.ServingRelease, v.URL = d.Release, d.Release, d.URL
		if d.Release == 0 {
			// No new release: the one that served serves on.
			if st, aerr := s.cfg.Backend.App(ctx, u, app); aerr == nil {
				v.ServingRelease, v.URL = st.Revision, st.URL
			}
		}
		v.Hint = hintOf(v, backend.Internal)
		d.App, d.Verdict = app, v
		return d, text, nil
	}
	kind := backend.KindOf(err)
	if st, aerr := s.cfg.Backend.App(ctx, u, app); aerr == nil {
		v.ServingRelease = st.Revision
		if st.Revision > 0 {
			v.URL = st.URL
		}
	}
	v.Hint = hintOf(v, kind)
	head, tail, _ := strings.Cut(msg, "\n")
	var lines []string
	if tail != "" {
		lines = strings.Split(strings.TrimRight(tail, "\n"), "\n")
		if len(lines) > maxTailLines {
			lines = lines[len(lines)-maxTailLines:]
		}
	}
	vals, oerr := s.cfg.Backend.ConfigValues(ctx, u, app)
	if oerr != nil {
		// The config cannot be read to mask the app's lines: bex's line
		// stays, cleaned; the tail is withheld.
		v.Message = cut(untrusted.Clean(head), maxMessageBytes)
		if len(lines) > 0 {
			v.LogTail = withheld
		}
		return Deployed{}, "", &verdictError{json: marshal(v), err: err}
	}
	if vals == nil {
		vals = map[string]string{}
	}
	for name, value := range set {
		if _, ok := vals[name]; !ok {
			vals[name] = value
		} else if vals[name] != value {
			vals[name+" (the failed release's)"] = value
		}
	}
	o := &appOutput{app: app, r: untrusted.NewRedactor(vals)}
	v.Message = cut(o.line(head), maxMessageBytes)
	return Deployed{}, "", &verdictError{json: fit(v, o, lines), err: err}
}

// fit is v's JSON with lines, what the app printed last, as its log tail,
// framed: at most 8 KiB, the tail's first lines cut (and said to be) when it
// would be longer.
func fit(v Verdict, o *appOutput, lines []string) string {
	for dropped := 0; ; dropped++ {
		switch {
		case len(lines) > 0 && dropped > 0:
			v.LogTail = fmt.Sprintf("(the first %d lines of the tail were cut to fit the verdict in 8 KiB)\n", dropped) +
				o.block(sourceTail, strings.Join(lines, "\n"))
		case len(lines) > 0:
			v.LogTail = o.block(sourceTail, strings.Join(lines, "\n"))
		case dropped > 0:
			v.LogTail = "(the tail was cut: it does not fit the verdict's 8 KiB; logs and build_logs show it)"
		default:
			v.LogTail = ""
		}
		js := marshal(v)
		if len(js) <= maxVerdictBytes || len(lines) == 0 {
			return js
		}
		lines = lines[1:]
	}
}

// marshal is v's JSON; a Verdict always marshals.
func marshal(v Verdict) string {
	// Without HTML escapes: the framed tail's "<" stays readable.
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(fmt.Sprintf("mcpserver: verdict: %v", err))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// cut is s in at most n bytes, whole characters, "…" marking a cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
