package sshcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"bex.co/bex/gitserver"
	"bex.co/bex/gitserver/backend"
)

// Config is what the commands work with. cmd/bex fills it.
type Config struct {
	// Backend does what the commands ask; it logs the audit lines and the
	// internal errors.
	Backend *backend.Backend
}

// DefaultConfig returns the defaults: there are none to choose.
func DefaultConfig() Config { return Config{} }

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	if c.Backend == nil {
		return errors.New("sshcmd: Config.Backend is required")
	}
	return nil
}

// Commands is the command tree of `ssh bex@HOST`. It implements gitserver.Commands.
type Commands struct {
	b *backend.Backend
}

var _ gitserver.Commands = (*Commands)(nil)

// New checks cfg and returns the commands.
func New(cfg Config) (*Commands, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Commands{b: cfg.Backend}, nil
}

// fail makes an Invalid error: bad input the command itself refuses.
func fail(format string, args ...any) error { return backend.Errorf(backend.Invalid, format, args...) }

// Run implements gitserver.Commands.
func (c *Commands) Run(ctx context.Context, s gitserver.CommandSession) int {
	// The key this session authenticated with is the one that counts (the
	// Directory's User may name another key of the same user).
	u := *s.User
	u.KeyFingerprint = s.KeyFingerprint
	sess := &session{Commands: c, ctx: ctx, user: &u, stdin: s.Stdin, out: s.Stdout, errOut: s.Stderr, tty: s.TTY}
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
		return sess.exit // a run's exit status; 0 for every other command
	}
	if ctx.Err() != nil {
		// The client left or the key was removed: nobody reads the answer.
		return 1
	}
	if backend.KindOf(err) == backend.Internal {
		c.b.Internal(&u, strings.Join(s.Args, " "), err)
	}
	fmt.Fprintf(s.Stderr, "bex: %s\n", oneLine(err.Error()))
	return exitStatus(backend.KindOf(err))
}

// exitStatus is the ssh exit status of an error of kind k: 1 for every kind,
// as git and most command lines do; the line on stderr says what went wrong.
// Programs that must tell the kinds apart use the MCP tools, whose errors carry
// the kind's code.
func exitStatus(backend.Kind) int { return 1 }

func oneLine(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
}

// session is one run of the tree: who asks, and where the answer goes.
type session struct {
	*Commands
	ctx    context.Context
	user   *backend.User
	stdin  io.Reader
	out    io.Writer
	errOut io.Writer
	// tty is the session's terminal (ssh -t), given to run only.
	tty *backend.TTY
	// exit is the session's exit status when the command succeeded (run sets
	// the one of its command).
	exit int
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
		&cobra.Group{ID: groupDatabases, Title: "Databases (Postgres, Redis):"},
		&cobra.Group{ID: groupConfig, Title: "Config and domains:"},
		&cobra.Group{ID: groupRun, Title: "Processes and releases:"},
		&cobra.Group{ID: groupLogs, Title: "Logs, metrics and the audit trail:"},
		&cobra.Group{ID: groupAccess, Title: "Access, keys and users:"},
		&cobra.Group{ID: groupSystem, Title: "The machine (admins):"},
	)
	root.SetHelpCommandGroupID(groupAccess)
	for _, c := range [][]*cobra.Command{s.appCommands(), s.configCommands(), s.webhookCommands(), s.psCommands(), s.runCommands(), s.cronCommands(), s.imageCommands(), s.volumeCommands(), s.databaseCommands(), s.logCommands(), s.auditCommands(), s.accessCommands(), s.keyCommands(), s.tokenCommands(), s.systemCommands()} {
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
