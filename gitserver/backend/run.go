package backend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"maps"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Runner runs one-off instances of an app's release: the runtime's OneOffs,
// which cmd/bex adapts (the gitserver does not import the deployer's packages).
type Runner interface {
	// Run runs spec to its end and returns the command's exit status (128+n
	// after signal n, 137 after Timeout); err is for a run that could not start
	// or be followed.
	Run(ctx context.Context, spec RunSpec) (exit int, err error)
	// Start starts spec detached: its output goes to the log of its process
	// (logs APP --process run.<id>). done, when not nil, gets the exit status.
	Start(ctx context.Context, spec RunSpec, done func(exit int)) error
}

// RunSpec is one one-off, as the runtime takes it.
type RunSpec struct {
	App       *appv1.App
	ID        string // 12 hex digits
	Process   string // "run.<id>"
	Release   int64
	Image     string
	Command   []string
	Env       []appv1.EnvVar
	Resources *appv1.Resources
	Timeout   time.Duration
	Stdin     io.Reader
	Stdout    io.Writer
	Stderr    io.Writer
	TTY       *TTY
}

// TTY is a one-off's terminal: its term, size and the sizes that follow.
type TTY struct {
	Term          string
	Width, Height uint16
	Resize        <-chan WindowSize
}

// WindowSize is a terminal's size in characters.
type WindowSize struct{ Width, Height uint16 }

// RunOptions is what `run` asks for.
type RunOptions struct {
	// Command is the argv, verbatim; required.
	Command []string
	// Detach starts the command and returns its id at once.
	Detach bool
	// TTY, when not nil, gives the command a terminal (ssh -t).
	TTY *TTY
	// Timeout bounds the run; 0: DefaultDetachedTimeout when detached, else only
	// the session.
	Timeout        time.Duration
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// RunResult is a run's id and, when not detached, its exit status.
type RunResult struct {
	ID      string `json:"id"`
	Process string `json:"process"`
	Exit    int    `json:"exitCode"`
}

// DefaultDetachedTimeout bounds a detached run: nobody watches it end.
const DefaultDetachedTimeout = 24 * time.Hour

// MaxRunArgs and MaxRunArgBytes bound a run's command.
const (
	MaxRunArgs     = 1024
	MaxRunArgBytes = 128 << 10
)

// Run runs a command in a new instance of the app's serving release: its image,
// config vars, and the limits of its web process type (of its first type by
// name when it has no web), with the app's confinement and network. Without
// Detach it returns when the command ends, with its exit status.
func (b *Backend) Run(ctx context.Context, u *User, name string, opts RunOptions) (RunResult, error) {
	if err := u.mayChange("run"); err != nil {
		return RunResult{}, err
	}
	if len(opts.Command) == 0 {
		return RunResult{}, Errorf(Invalid, "run %s: give the command to run, e.g. run %s -- sh", name, name)
	}
	n := 0
	for _, a := range opts.Command {
		n += len(a)
	}
	if len(opts.Command) > MaxRunArgs || n > MaxRunArgBytes {
		return RunResult{}, Errorf(Invalid, "run %s: the command is too long (at most %d words, %d bytes)", name, MaxRunArgs, MaxRunArgBytes)
	}
	a, err := b.app(ctx, u, name)
	if err != nil {
		return RunResult{}, err
	}
	if b.cfg.Runner == nil {
		return RunResult{}, Errorf(Invalid, "this server cannot run one-off commands")
	}
	if a.Spec.Image == "" {
		return RunResult{}, Errorf(Invalid, "%s has no release serving yet: git push deploys it first", name)
	}
	command := opts.Command
	if p, ok := a.Spec.Processes[command[0]]; ok && len(p.Command) > 0 {
		// Heroku's and Dokku's `run APP console`: a process type's command,
		// with the words after it appended.
		command = processCommand(p.Command, command[1:])
	}
	spec := RunSpec{App: a, ID: newRunID(), Release: a.Spec.Release, Image: a.Spec.Image,
		Command: command, Env: a.Spec.Env, Timeout: opts.Timeout}
	spec.Process = "run." + spec.ID
	if t := runType(a); t != "" {
		spec.Resources = a.Spec.Processes[t].Resources
	}
	if err := wouldChange(ctx, func(p *Plan) {
		p.Command, p.Release, p.ServingRelease = command, 0, a.Status.Revision
		p.Changes = append(p.Changes, fmt.Sprintf("would start a one-off instance of release v%d (%s) running %s, with the app's config and the limits of its %s processes", spec.Release, spec.Image, strings.Join(command, " "), runType(a)))
	}); err != nil {
		return RunResult{}, err
	}
	audit := func() {
		b.audit(u, "run", name, "id", spec.ID, "release", spec.Release, "detach", opts.Detach, "tty", opts.TTY != nil,
			"command", strings.Join(opts.Command, " "))
	}
	if !opts.Detach {
		spec.Stdin, spec.Stdout, spec.Stderr, spec.TTY = opts.Stdin, opts.Stdout, opts.Stderr, opts.TTY
	}
	exit, err := b.runOneOff(ctx, "run", name, name, spec, opts.Detach, audit)
	if err != nil {
		return RunResult{}, err
	}
	return RunResult{ID: spec.ID, Process: spec.Process, Exit: exit}, nil
}

// runOneOff runs spec through the Runner, at most MaxRunsPerApp at once for
// bound (an app's name; a database's runtime name, so that its one-offs are
// counted apart from any app's): detached when detach (its end is logged, its
// exit status is not waited for), else to its end with the streams spec
// carries, returning the exit status. audit is called once the run has its
// place, before it starts. op and name are what the errors say ("run shop").
func (b *Backend) runOneOff(ctx context.Context, op, name, bound string, spec RunSpec, detach bool, audit func()) (int, error) {
	if !b.runs.take(bound) {
		return 0, Errorf(Conflict, "%s has %d one-off commands running, the most at once: wait for one to end", name, MaxRunsPerApp)
	}
	var once sync.Once
	release := func() { once.Do(func() { b.runs.give(bound) }) }
	audit()
	if detach {
		if spec.Timeout == 0 {
			spec.Timeout = DefaultDetachedTimeout
		}
		log := b.log
		if err := b.cfg.Runner.Start(context.WithoutCancel(ctx), spec, func(exit int) {
			release()
			log.Info("run ended", "app", name, "id", spec.ID, "exit", exit)
		}); err != nil {
			release()
			return 0, Errorf(Failed, "%s %s: %v", op, name, err)
		}
		return 0, nil
	}
	exit, err := b.cfg.Runner.Run(ctx, spec)
	release()
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, Errorf(Failed, "%s %s: %v", op, name, err)
	}
	return exit, nil
}

// processCommand is the argv of a one-off that runs a process type's command
// with args after it. A process's command is written for the container's command
// field, where $$ is a dollar sign and $(VAR) a variable (builder/plan escapes the
// Procfile's line that way); a one-off's is taken verbatim, so the escaping is
// undone. A shell's command line (sh -c LINE, a Procfile's line on an image with a
// shell) gets the args as its positional parameters after LINE ("$@"): they reach
// the command as the words they were, not read again by the shell; another argv
// gets them appended.
func processCommand(process []string, args []string) []string {
	argv := make([]string, len(process))
	for i, w := range process {
		argv[i] = unescapeContainerCommand(w)
	}
	if len(args) == 0 {
		return argv
	}
	if len(argv) == 3 && (argv[0] == "sh" || argv[0] == "/bin/sh") && argv[1] == "-c" {
		return append([]string{argv[0], "-c", argv[2] + ` "$@"`, argv[0]}, args...)
	}
	return append(argv, args...)
}

// unescapeContainerCommand undoes the escaping of a container command's word: $$
// is one dollar sign. A $(VAR) stays as it is written (the runtime expands
// variables in a process's command, not in a one-off's).
func unescapeContainerCommand(w string) string {
	return strings.ReplaceAll(w, "$$", "$")
}

// MaxRunsPerApp bounds the one-off commands of one app running at once through
// this server (interactive and detached): each holds an instance with the app's
// limits, so a member's loop of `run --detach` must not fill the machine.
const MaxRunsPerApp = 10

// runCounter counts each app's running one-offs.
type runCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *runCounter) take(app string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[app] >= MaxRunsPerApp {
		return false
	}
	c.n[app]++
	return true
}

func (c *runCounter) give(app string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[app]--; c.n[app] <= 0 {
		delete(c.n, app)
	}
}

// runType is the process type whose limits a run gets: web, else the first by
// name ("" when the app has none).
func runType(a *appv1.App) string {
	if _, ok := a.Spec.Processes["web"]; ok {
		return "web"
	}
	types := slices.Sorted(maps.Keys(a.Spec.Processes))
	if len(types) == 0 {
		return ""
	}
	return types[0]
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// oneOffProcess matches the process names of one-offs' logs: release,
// postdeploy, run.<id>, cron.<job>. Nothing else (no path characters) passes.
var oneOffProcess = regexp.MustCompile(`^(release|postdeploy|(run|cron)\.[a-z0-9][a-z0-9-]{0,62})$`)

// IsOneOffProcess reports whether p names one-offs' logs (logs --process).
func IsOneOffProcess(p string) bool { return oneOffProcess.MatchString(p) }
