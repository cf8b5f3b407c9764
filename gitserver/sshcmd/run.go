package sshcmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
)

// runCommands is `run`: a command in a one-off instance of the app's release.
func (s *session) runCommands() []*cobra.Command {
	var detach bool
	run := newCmd(groupRun, "run [--detach] APP [--] CMD [ARGS...]", "Run a command in a one-off instance of the app's release", args(2, -1), func(_ *cobra.Command, a []string) error {
		app, cmd := a[0], a[1:]
		if len(cmd) > 0 && cmd[0] == "--" {
			cmd = cmd[1:]
		}
		if len(cmd) == 0 {
			return fail("usage: run [--detach] APP [--] CMD [ARGS...]")
		}
		opts := backend.RunOptions{Command: cmd, Detach: detach}
		if !detach {
			opts.Stdin, opts.Stdout, opts.Stderr, opts.TTY = s.stdin, s.out, s.errOut, s.tty
			if s.tty != nil {
				opts.Stderr = s.out // one stream on a terminal
			}
		}
		res, err := s.b.Run(s.ctx, s.user, app, opts)
		if err != nil {
			return err
		}
		if detach {
			fmt.Fprintf(s.out, "%s\n", res.ID)
			fmt.Fprintf(s.errOut, "Started %s; its output: logs %s --process %s\n", res.Process, app, res.Process)
			return nil
		}
		s.exit = res.Exit
		return nil
	})
	// Flags only before APP: the words after it are the command's own.
	run.Flags().SetInterspersed(false)
	flags(run).BoolVarP(&detach, "detach", "d", false, "start it and print its id; output goes to logs APP --process run.<id>")
	return []*cobra.Command{run}
}
