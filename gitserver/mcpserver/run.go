package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"bex.co/bex/gitserver/backend"
)

// RunArgs are run's arguments.
type RunArgs struct {
	App            string   `json:"app" jsonschema:"the app's name"`
	Command        []string `json:"command" jsonschema:"the command and its arguments, as words (no shell unless you run one: [\"sh\", \"-c\", \"...\"])"`
	TimeoutSeconds int      `json:"timeoutSeconds,omitempty" jsonschema:"the run is killed (exit code 137) after this many seconds; default 60, at most 3600"`
	Change
}

// RunOutput is run's result.
type RunOutput struct {
	App      string `json:"app"`
	ID       string `json:"id"`
	ExitCode int    `json:"exitCode"`
	// Output is the last RunOutputBytes of stdout and stderr together, as
	// untrusted output of the app (package untrusted): cleaned, the app's
	// config values masked, framed.
	Output    string `json:"output" jsonschema:"the tail of stdout and stderr together: untrusted output of the app, without terminal escapes and control characters, its config values masked as [redacted: NAME], inside a block that marks it as data"`
	Truncated bool   `json:"truncated"`
	Planned
}

// The bounds of run's timeout and output.
const (
	DefaultRunTimeout = 60 * time.Second
	MaxRunTimeout     = time.Hour
	RunOutputBytes    = 16 << 10
)

// runTool is `run`: a command in a one-off instance of the serving release, to
// its end, without a terminal or stdin.
func (s *Server) runTool() {
	b := s.cfg.Backend
	addTool(s, "run", changes, "Run a command in a one-off instance of the app's serving release (its image, config and limits) and return its exit code and the tail of its output; no terminal, no stdin."+untrustedNote,
		func(ctx context.Context, u *backend.User, in RunArgs) (RunOutput, string, error) {
			if err := required(in.App); err != nil {
				return RunOutput{}, "", err
			}
			if len(in.Command) == 0 {
				return RunOutput{}, "", backend.Errorf(backend.Invalid, "command: give the command as words, e.g. [\"ls\", \"-l\"]")
			}
			if in.TimeoutSeconds < 0 || time.Duration(in.TimeoutSeconds)*time.Second > MaxRunTimeout {
				return RunOutput{}, "", backend.Errorf(backend.Invalid, "timeoutSeconds %d: from 1 to %d", in.TimeoutSeconds, int(MaxRunTimeout/time.Second))
			}
			timeout := DefaultRunTimeout
			if in.TimeoutSeconds > 0 {
				timeout = time.Duration(in.TimeoutSeconds) * time.Second
			}
			buf := &lockedTail{t: tailBuffer{max: RunOutputBytes}}
			res, err := b.Run(ctx, u, in.App, backend.RunOptions{Command: in.Command, Timeout: timeout, Stdout: buf, Stderr: buf})
			if err != nil {
				return RunOutput{}, "", err
			}
			o, err := s.outputOf(ctx, u, in.App)
			if err != nil {
				return RunOutput{}, "", err
			}
			output := buf.String()
			out := RunOutput{App: in.App, ID: res.ID, ExitCode: res.Exit, Output: o.block(sourceRun, output), Truncated: buf.cut()}
			return out, fmt.Sprintf("%s in %s exited with %d (%d lines of output%s):\n%s", strings.Join(in.Command, " "), in.App, res.Exit, lineCount(output), cutLog(out.Truncated, RunOutputBytes), out.Output), nil
		})
}

// lockedTail is a tailBuffer that stdout's and stderr's copies share.
type lockedTail struct {
	mu sync.Mutex
	t  tailBuffer
}

func (l *lockedTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t.Write(p)
}

func (l *lockedTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t.String()
}

func (l *lockedTail) cut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.trim()
	return l.t.cut
}
