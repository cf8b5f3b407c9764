package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A write to a stdout or stderr nobody reads any more (bex up | tee, and tee
	// was ended) fails with EPIPE instead of ending the process: Go's default
	// would kill bex up in the middle of stopping its daemons, leaving their
	// mounts behind. Notify, not Ignore: what bex starts gets SIGPIPE's default.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	root, logs := newRoot(os.Stdout, os.Stderr)
	// controller-runtime (the API cache, controllers) logs through the same handler.
	ctrllog.SetLogger(logr.FromSlogHandler(logs))
	if err := root.ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			fmt.Fprintln(os.Stderr, ee.line)
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "bex:", err)
		os.Exit(1)
	}
}

// subcommand is what every bex subcommand implements.
type subcommand interface {
	// command returns the cobra command with its flags bound to the struct.
	command() *cobra.Command
	// run does the work; it returns when ctx ends or the work is done.
	run(ctx context.Context) error
	// close releases what run acquired; it is called once, after run.
	close() error
}

// newRoot builds the command tree, writing to out and errOut, and returns the
// handler of its log (on errOut, in the format --log-format chooses).
func newRoot(out, errOut io.Writer) (*cobra.Command, slog.Handler) {
	root := &cobra.Command{
		Use:           "bex",
		Short:         "bex: git push, get a running HTTPS service, on machines you own",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	logs := &logHandler{w: errOut, format: "text"}
	root.PersistentFlags().StringVar(&logs.format, "log-format", "text",
		"log lines as text (key=value) or json (one object per line, for log collectors); also BEX_LOG_FORMAT")
	var goMemoryLimit byteSize
	goGC := -1
	root.PersistentFlags().Var(&goMemoryLimit, "go-memory-limit",
		"soft limit of this process's Go memory, e.g. 64Mi (runtime/debug.SetMemoryLimit): past it the garbage collector works harder instead of the heap growing; bex up gives each of its components one (default: none)")
	root.PersistentFlags().IntVar(&goGC, "go-gc-percent", -1,
		"the Go garbage collector's target, in percent of the live heap (runtime/debug.SetGCPercent); lower spends CPU to hold less memory; -1 leaves Go's default (100); bex up gives each of its components one")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		// Flags, not GOMEMLIMIT/GOGC: bex up tells a child every setting on its
		// command line (up.Platform.component), and a variable would also reach
		// whatever the child starts.
		if goMemoryLimit > 0 {
			debug.SetMemoryLimit(int64(goMemoryLimit))
		}
		if goGC < -1 {
			return fmt.Errorf("--go-gc-percent %d: want a percentage, or -1 for Go's default", goGC)
		}
		if goGC >= 0 {
			debug.SetGCPercent(goGC)
		}
		f := cmd.Flags().Lookup("log-format")
		if v, ok := os.LookupEnv("BEX_LOG_FORMAT"); ok && !f.Changed {
			logs.format = v
		}
		if logs.format != "text" && logs.format != "json" {
			return fmt.Errorf("--log-format %q: want text or json", logs.format)
		}
		// Nothing is passed on through the environment: bex up gives its children
		// the format as their --log-format (up.Config.LogFormat).
		return nil
	}
	log := slog.New(logs)
	for _, s := range []subcommand{
		&versionCmd{out: out},
		&planCmd{out: out},
		&gitserverCmd{errOut: errOut, log: log},
		&deployerCmd{errOut: errOut, log: log},
		&edgeCmd{errOut: errOut, log: log},
		&upCmd{out: out, errOut: errOut, log: log, logFormat: &logs.format},
		&buildNetworkCmd{out: out},
	} {
		root.AddCommand(wire(s))
	}
	users := &cobra.Command{Use: "users", Short: "Manage users on this server (the first admin); later: ssh bex@HOST users:add"}
	users.AddCommand(wire(&usersAddCmd{out: out}), wire(&usersListCmd{out: out}))
	root.AddCommand(users)
	root.AddCommand(newVolumeArchiveCmd(out, errOut))
	return root, logs
}

// wire makes a subcommand's cobra command call run, then close.
func wire(s subcommand) *cobra.Command {
	c := s.command()
	c.RunE = func(cmd *cobra.Command, _ []string) (err error) {
		defer func() {
			if cerr := s.close(); err == nil {
				err = cerr
			}
		}()
		return s.run(cmd.Context())
	}
	return c
}

// say writes a line for whoever watches the command (where it listens, what it
// serves): as is with --log-format text, and as an INFO record of the log with
// --log-format json, so that a log collector reading stderr reads JSON only.
func say(w io.Writer, log *slog.Logger, format string, args ...any) {
	if h, ok := log.Handler().(*logHandler); ok && h.format == "json" {
		log.Info(fmt.Sprintf(format, args...))
		return
	}
	fmt.Fprintf(w, format+"\n", args...)
}

// logHandler writes bex's log as text or JSON. The loggers are made with the
// command tree, before --log-format is parsed, so it picks its handler at the
// first use, which comes after.
type logHandler struct {
	w      io.Writer
	format string
	once   sync.Once
	h      slog.Handler
}

func (l *logHandler) handler() slog.Handler {
	l.once.Do(func() {
		if l.format == "json" {
			l.h = slog.NewJSONHandler(l.w, nil)
		} else {
			l.h = slog.NewTextHandler(l.w, nil)
		}
	})
	return l.h
}

func (l *logHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.handler().Enabled(ctx, level)
}
func (l *logHandler) Handle(ctx context.Context, r slog.Record) error {
	return l.handler().Handle(ctx, r)
}
func (l *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler { return l.handler().WithAttrs(attrs) }
func (l *logHandler) WithGroup(name string) slog.Handler       { return l.handler().WithGroup(name) }
