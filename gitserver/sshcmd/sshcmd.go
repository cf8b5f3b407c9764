package sshcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/gitserver/tokens"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/gitserver"
	"bex.co/bex/internal/appops"
)

// RuntimeLogs reads what an app's processes print.
type RuntimeLogs interface {
	// Logs writes app's recent log lines to w, each prefixed with its instance
	// ("web.1[r3]: "); with opts.Follow it then writes new lines until ctx ends. An
	// error says, in the reader's terms, why there are no logs to read.
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

// BuildLogs are the stored outputs of an app's recent builds.
type BuildLogs interface {
	// List returns app's stored build logs, newest first.
	List(app string) ([]Build, error)
	// Open opens the log with the given ID, or returns an error wrapping
	// fs.ErrNotExist.
	Open(app, id string) (io.ReadCloser, error)
}

// Build is one stored build log.
type Build struct {
	ID     string
	Commit string
	Time   time.Time
}

// Config is what the commands work with. cmd/bex fills it.
type Config struct {
	// Client writes to the API server and reads what must not be stale (Releases,
	// the Users a key decision rests on).
	Client client.Client
	// Reader reads Apps and Users, usually from an informer cache. Default Client.
	Reader client.Reader
	// Namespace holds the Apps.
	Namespace string
	// SecretsNamespace holds the webhook secrets (the gitserver's
	// --secrets-namespace; Tokens has its own, the same). Default Namespace.
	SecretsNamespace string
	// Releases records and awaits config changes and rollbacks. Its Client and
	// Namespace should be Client and Namespace.
	Releases *releases.Recorder
	// Logs reads runtime logs; nil: `logs` says they are not available.
	Logs RuntimeLogs
	// Builds reads build logs; nil: `builds` says they are not available.
	Builds BuildLogs
	// RemoveRepository deletes an app's git repository (apps:destroy); nil: nothing
	// to remove.
	RemoveRepository func(ctx context.Context, app string) error
	// RolloutTimeout bounds how long config:set and rollback wait for the release to
	// serve. Default 5 minutes.
	RolloutTimeout time.Duration
	// CacheWait bounds how long a write waits for Reader to see it. Default 5 s.
	CacheWait time.Duration
	// Host is how users reach the server, for the hints the commands print
	// ("ssh://git@HOST:PORT"). Default "ssh://git@HOST:PORT".
	Host string
	// HooksURL is the base URL of the webhooks ("https://bex.example.com"), for
	// `webhooks APP`; empty: this server serves none.
	HooksURL string
	// Tokens keeps the agents' API tokens; nil: the tokens commands say there is
	// no such API.
	Tokens *tokens.Store
	// DeployKey returns the public key (authorized_keys form) bex fetches ssh
	// upstreams with; nil: not shown.
	DeployKey func() string
	// Log receives the audit lines and internal errors.
	Log *slog.Logger
}

// Commands is the command tree of `ssh bex@HOST`. It implements gitserver.Commands.
type Commands struct {
	cfg Config
	ops *appops.Ops
	log *slog.Logger
}

var _ gitserver.Commands = (*Commands)(nil)

// New checks cfg and returns the commands.
func New(cfg Config) (*Commands, error) {
	if cfg.Client == nil || cfg.Releases == nil || cfg.Namespace == "" {
		return nil, errors.New("sshcmd: a Client, a release Recorder and a Namespace are required")
	}
	if cfg.Reader == nil {
		cfg.Reader = cfg.Client
	}
	if cfg.SecretsNamespace == "" {
		cfg.SecretsNamespace = cfg.Namespace
	}
	if cfg.RolloutTimeout <= 0 {
		cfg.RolloutTimeout = 5 * time.Minute
	}
	if cfg.CacheWait <= 0 {
		cfg.CacheWait = 5 * time.Second
	}
	if cfg.Host == "" {
		cfg.Host = "ssh://git@HOST:PORT"
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ops := &appops.Ops{Client: cfg.Client, Reader: cfg.Reader, Namespace: cfg.Namespace, Releases: cfg.Releases, CacheWait: cfg.CacheWait}
	return &Commands{cfg: cfg, ops: ops, log: log.WithGroup("sshcmd")}, nil
}

// userError is a refusal or bad input: printed as it is, not logged as a failure.
// It is appops' Error, so that the refusals of the shared operations print alike.
type userError = appops.Error

// fail makes a userError.
func fail(format string, args ...any) error { return appops.Fail(appops.Invalid, format, args...) }

// exitError ends a command with a status and, when msg is set, a line.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Run implements gitserver.Commands.
func (c *Commands) Run(ctx context.Context, s gitserver.CommandSession) int {
	sess := &session{Commands: c, ctx: ctx, user: s.User, fp: s.KeyFingerprint, stdin: s.Stdin, out: s.Stdout, errOut: s.Stderr,
		log: c.log.With("user", s.User.Name, "key", s.User.KeyName, "fingerprint", s.KeyFingerprint)}
	root := sess.tree()
	root.InitDefaultHelpCmd()
	args := s.Args
	if len(args) == 0 {
		args = []string{"help"}
	}
	if name := args[0]; !strings.HasPrefix(name, "-") {
		if cmd, _, err := root.Find(args[:1]); err != nil || cmd == root {
			hint := `run "help" to list the commands`
			if sugg := root.SuggestionsFor(name); len(sugg) > 0 {
				hint = "did you mean " + strings.Join(sugg[:min(len(sugg), 3)], " or ") + "?"
			}
			fmt.Fprintf(s.Stderr, "bex: unknown command %q: %s\n", name, hint)
			return 1
		}
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ue *userError
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintf(s.Stderr, "bex: %s\n", oneLine(ee.msg))
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(s.Stderr, "bex: %s\n", oneLine(ue.Msg))
	case ctx.Err() != nil:
		// The client left or the key was removed: nobody reads the answer.
	default:
		sess.log.Error("command failed", "command", strings.Join(s.Args, " "), "err", err)
		fmt.Fprintf(s.Stderr, "bex: %s\n", oneLine(err.Error()))
	}
	return 1
}

func oneLine(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
}

// session is one run of the tree: who asks, and where the answer goes.
type session struct {
	*Commands
	ctx    context.Context
	user   *gitserver.User
	fp     string
	stdin  io.Reader
	out    io.Writer
	errOut io.Writer
	log    *slog.Logger
}

// audit logs a change: who, what, which app.
func (s *session) audit(command, app string, attrs ...any) {
	s.log.Info("audit", append([]any{"command", command, "app", app}, attrs...)...)
}

// Groups of the help.
const (
	groupApps   = "apps"
	groupConfig = "config"
	groupRun    = "run"
	groupLogs   = "logs"
	groupAccess = "access"
)

func init() {
	cobra.AddTemplateFunc("sshLine", func(line string) string {
		return "ssh bex@HOST" + strings.TrimPrefix(line, "bex")
	})
}

func (s *session) tree() *cobra.Command {
	root := &cobra.Command{
		Use:   "bex",
		Short: "bex over SSH",
		Long: "bex over SSH: ssh bex@HOST <command> [arguments] [flags]\n" +
			"Arguments are words as a shell splits them, and are never evaluated.\n" +
			"Read commands take --json (schemas: docs/commands.md).",
		SilenceUsage:               true,
		SilenceErrors:              true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions: cobra.CompletionOptions{
			DisableDefaultCmd: true,
		},
	}
	// Usage lines read as the user types them: "ssh bex@HOST apps:info APP".
	root.SetUsageTemplate(strings.NewReplacer(
		"{{.UseLine}}", "{{sshLine .UseLine}}",
		"{{.CommandPath}}", "{{sshLine .CommandPath}}",
	).Replace(root.UsageTemplate()))
	root.SetIn(s.stdin)
	root.SetOut(s.out)
	root.SetErr(s.errOut)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fail("%s: %v (%s --help lists its flags)", cmd.Name(), err, cmd.Name())
	})
	root.AddGroup(
		&cobra.Group{ID: groupApps, Title: "Apps:"},
		&cobra.Group{ID: groupConfig, Title: "Config and domains:"},
		&cobra.Group{ID: groupRun, Title: "Processes and releases:"},
		&cobra.Group{ID: groupLogs, Title: "Logs:"},
		&cobra.Group{ID: groupAccess, Title: "Access, keys and users:"},
	)
	root.SetHelpCommandGroupID(groupAccess)
	for _, c := range [][]*cobra.Command{s.appCommands(), s.configCommands(), s.webhookCommands(), s.psCommands(), s.logCommands(), s.accessCommands(), s.keyCommands(), s.tokenCommands()} {
		root.AddCommand(c...)
	}
	return root
}

// args checks the number of positional arguments, naming the usage on a mismatch.
func args(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) < min || (max >= 0 && len(a) > max) {
			return fail("usage: %s", cmd.Use)
		}
		return nil
	}
}

// jsonFlag adds --json to cmd.
func jsonFlag(cmd *cobra.Command, to *bool) {
	cmd.Flags().BoolVar(to, "json", false, "print JSON (schema: docs/commands.md)")
}

// newCmd makes a command in group with run bound to the session.
func newCmd(group, use, short string, posArgs cobra.PositionalArgs, run func(cmd *cobra.Command, args []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, GroupID: group, Args: posArgs, RunE: run,
		DisableFlagsInUseLine: true}
}

// flags returns cmd's flag set (a helper that reads better in the builders).
func flags(cmd *cobra.Command) *pflag.FlagSet { return cmd.Flags() }
