package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/untrusted"
)

// TestJudgeMapsEveryEnding: the one mapping of a change's ending to the
// verdict's status, phase, release and exit code, for each error the
// backend, the pipeline and the release recorder give (their marks, as
// backend.StoppedAt puts them), and the hint each gets.
func TestJudgeMapsEveryEnding(t *testing.T) {
	failed := func(stop backend.Stop, format string, args ...any) error {
		return backend.StoppedAt(backend.Errorf(backend.Failed, format, args...), stop)
	}
	code := func(n int) *int { return &n }
	for _, c := range []struct {
		name, tool string
		err        error
		status     string
		phase      backend.Phase
		release    int64
		exit       *int
		hint       string
	}{
		{"serves", "deploy", nil, StatusLive, backend.PhaseRollout, 0, nil, "serves"},
		{"invalid", "deploy", backend.Errorf(backend.Invalid, `commit "x": give a full 40-digit commit`), StatusRejected, backend.PhaseFetch, 0, nil, "fix what message says"},
		{"forbidden", "set_config", backend.Errorf(backend.Forbidden, "a read-only token"), StatusRejected, backend.PhaseRelease, 0, nil, "may not make this change"},
		{"busy", "deploy_image", backend.Errorf(backend.Conflict, "another push or deploy of the app is running: try again once it ends"), StatusRejected, backend.PhaseFetch, 0, nil, "try again once it ends"},
		{"no such release", "rollback", backend.Errorf(backend.NotFound, "shop has no release v9"), StatusRejected, backend.PhaseRelease, 0, nil, "check the names"},
		{"upstream fetch", "deploy", failed(backend.Stop{Phase: backend.PhaseFetch}, "deploy failed: fetching main from https://git.example/shop: connection refused"), StatusFailed, backend.PhaseFetch, 0, nil, "Nothing could be fetched"},
		{"no such image", "deploy_image", backend.StoppedAt(backend.Errorf(backend.NotFound, "image not found: registry.example/shop:nope"), backend.Stop{Phase: backend.PhaseFetch}), StatusFailed, backend.PhaseFetch, 0, nil, "Nothing could be fetched"},
		{"registry out of reach", "deploy_image", backend.StoppedAt(backend.Errorf(backend.Invalid, "could not reach the registry 127.0.0.1:1: connection refused"), backend.Stop{Phase: backend.PhaseFetch}), StatusFailed, backend.PhaseFetch, 0, nil, "Nothing could be fetched"},
		{"build step", "deploy", failed(backend.Stop{Phase: backend.PhaseBuild}, "deploy failed: the build of abcdef0 failed: step RUN make failed with exit code 2; its last output:\n    make: *** no rule"), StatusFailed, backend.PhaseBuild, 0, code(2), "The build failed"},
		{"build timeout", "deploy", failed(backend.Stop{Phase: backend.PhaseBuild, TimedOut: true}, "deploy failed: the build of abcdef0 ran longer than 30m0s"), StatusTimeout, backend.PhaseBuild, 0, nil, "time limit"},
		{"release command", "set_config", failed(backend.Stop{Phase: backend.PhaseRelease, Release: 4}, "release v4 failed: release command exited with status 3; the config is unchanged"), StatusFailed, backend.PhaseRelease, 4, code(3), "release command"},
		{"crash on boot", "set_config", failed(backend.Stop{Phase: backend.PhaseHealth, Release: 5}, "release v5 of shop did not roll out: web.1 keeps exiting: 3 exits within 1m0s (last: exited with code 1); last log lines:\nboom"), StatusFailed, backend.PhaseHealth, 5, code(1), "did not come up"},
		{"no answer", "deploy", failed(backend.Stop{Phase: backend.PhaseHealth, Release: 5}, "deploy failed: release v5 did not serve: rollout failed: web.1 did not accept a TCP connection on port 5000 within 1m0s"), StatusFailed, backend.PhaseHealth, 5, nil, "did not answer on PORT"},
		{"replaced", "rollback", failed(backend.Stop{Phase: backend.PhaseRollout, Release: 5}, "release v5 of shop did not roll out: release v5 was replaced by v6 before it served"), StatusFailed, backend.PhaseRollout, 5, nil, "The rollout did not finish"},
		{"rollout timeout", "set_config", failed(backend.Stop{Phase: backend.PhaseRollout, TimedOut: true, Release: 5}, "release v5 of shop is not serving after 5m0s: it may still come up"), StatusTimeout, backend.PhaseRollout, 5, nil, "may still come up"},
		{"unmarked failure", "deploy", backend.Errorf(backend.Failed, "release v5 serves, but moving main failed"), StatusFailed, backend.PhaseRollout, 0, nil, "The rollout did not finish"},
		{"bex failed", "rollback", errors.New("etcd is down"), StatusFailed, backend.PhaseRelease, 0, nil, "ask the server's admin"},
		{"call ran out of time", "deploy", fmt.Errorf("waiting: %w", context.DeadlineExceeded), StatusTimeout, backend.PhaseFetch, 0, nil, "may still come up"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, msg := judge(c.tool, c.err)
			if c.err != nil && msg != c.err.Error() {
				t.Errorf("message %q", msg)
			}
			if v.Status != c.status || v.Phase != string(c.phase) || v.Release != c.release {
				t.Errorf("got %s/%s release %d, want %s/%s release %d", v.Status, v.Phase, v.Release, c.status, c.phase, c.release)
			}
			if (v.ExitCode == nil) != (c.exit == nil) || (v.ExitCode != nil && *v.ExitCode != *c.exit) {
				t.Errorf("exit code %v, want %v", v.ExitCode, c.exit)
			}
			v.ServingRelease, v.Release = 3, max(v.Release, 1)
			hint := hintOf(v, backend.KindOf(c.err))
			if !strings.Contains(hint, c.hint) || strings.Count(hint, ". ") > 0 || !strings.HasSuffix(hint, ".") {
				t.Errorf("hint %q: want one sentence with %q", hint, c.hint)
			}
			if v.Status != StatusLive && v.Status != StatusRejected && !strings.Contains(hint, "release v3 keeps serving") {
				t.Errorf("hint %q does not say what serves", hint)
			}
		})
	}
}

// TestAVerdictFitsIn8KiB: a tail too long for 8 KiB loses its first lines,
// and says so; the lines kept are the last, framed, masked.
func TestAVerdictFitsIn8KiB(t *testing.T) {
	o := &appOutput{app: "shop", r: untrusted.NewRedactor(map[string]string{"API_KEY": "sk-live-0123456789"})}
	v := Verdict{Status: StatusFailed, Phase: "health", Message: "release v2 of shop did not roll out", Hint: "read log_tail"}
	var lines []string
	for i := range maxTailLines {
		lines = append(lines, fmt.Sprintf("line %02d key=sk-live-0123456789 %s", i, strings.Repeat("x", 300)))
	}
	js := fit(v, o, lines)
	if len(js) > maxVerdictBytes {
		t.Fatalf("%d bytes", len(js))
	}
	var got Verdict
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got.LogTail, "(the first ") || !strings.Contains(got.LogTail, "lines of the tail were cut to fit the verdict in 8 KiB)\n") ||
		!strings.Contains(got.LogTail, "line 39 key=[redacted: API_KEY]") || strings.Contains(got.LogTail, "line 00 ") ||
		strings.Contains(got.LogTail, "sk-live") || !strings.Contains(got.LogTail, `<untrusted-app-output app="shop" source="the last output">`) {
		t.Errorf("tail:\n%s", got.LogTail)
	}
	// A short tail stays whole.
	if js := fit(v, o, lines[:3]); strings.Contains(js, "were cut") || !strings.Contains(js, "line 02") {
		t.Errorf("short tail: %s", js)
	}
	// One line longer than 8 KiB: no tail, said so.
	if err := json.Unmarshal([]byte(fit(v, o, []string{strings.Repeat("y", 9000)})), &got); err != nil || !strings.HasPrefix(got.LogTail, "(the tail was cut") {
		t.Errorf("a line too long: %v %q", err, got.LogTail)
	}
}
