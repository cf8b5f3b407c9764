package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// controller-runtime (the API cache, controllers) logs through the same handler.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	if err := newRoot(os.Stdout, os.Stderr).ExecuteContext(ctx); err != nil {
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

// newRoot builds the command tree, writing to out and errOut.
func newRoot(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "bex",
		Short:         "bex: git push, get a running HTTPS service, on machines you own",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	log := slog.New(slog.NewTextHandler(errOut, nil))
	for _, s := range []subcommand{
		&versionCmd{out: out},
		&planCmd{out: out},
		&gitserverCmd{errOut: errOut, log: log},
		&deployerCmd{errOut: errOut, log: log},
		&edgeCmd{errOut: errOut, log: log},
		&upCmd{out: out, errOut: errOut, log: log},
	} {
		root.AddCommand(wire(s))
	}
	users := &cobra.Command{Use: "users", Short: "Manage users on this server (the first admin); later: ssh bex@HOST users:add"}
	users.AddCommand(wire(&usersAddCmd{out: out}), wire(&usersListCmd{out: out}))
	root.AddCommand(users)
	return root
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
