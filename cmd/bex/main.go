package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	for _, s := range []subcommand{
		&versionCmd{out: out},
	} {
		root.AddCommand(wire(s))
	}
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
