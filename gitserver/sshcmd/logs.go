package sshcmd

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
)

func (s *session) logCommands() []*cobra.Command {
	var opts backend.LogOptions
	logs := newCmd(groupLogs, "logs APP [-f] [-n N] [--process TYPE]", "Show what an app's processes print", args(1, 1), func(_ *cobra.Command, a []string) error {
		return s.b.Logs(s.ctx, s.user, a[0], opts, s.out)
	})
	flags(logs).BoolVarP(&opts.Follow, "follow", "f", false, "keep printing new lines")
	flags(logs).IntVarP(&opts.Lines, "num", "n", 100, "recent lines of each instance to show first")
	flags(logs).StringVar(&opts.Process, "process", "", "only this process type")

	var asJSON bool
	builds := newCmd(groupLogs, "builds APP", "List an app's recent builds", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Builds(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintf(s.out, "%s has no builds yet: git push builds it.\n", a[0])
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "ID\tCOMMIT\tWHEN\tRESULT")
		for _, b := range out {
			fmt.Fprintf(w, "%s\t%.12s\t%s\t%s\n", b.ID, b.Commit, b.Time.Format(time.RFC3339), b.Result)
		}
		return w.Flush()
	})
	jsonFlag(builds, &asJSON)

	buildLog := newCmd(groupLogs, "builds:logs APP [ID]", "Print the output of a build (default: the latest)", args(1, 2), func(_ *cobra.Command, a []string) error {
		id := ""
		if len(a) == 2 {
			id = a[1]
		}
		_, f, err := s.b.BuildLog(s.ctx, s.user, a[0], id)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(s.out, f)
		return err
	})
	return []*cobra.Command{logs, builds, buildLog}
}
