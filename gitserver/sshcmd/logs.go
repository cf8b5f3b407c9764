package sshcmd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/spf13/cobra"
)

// BuildInfo is one build in `builds --json`, newest first.
type BuildInfo struct {
	ID     string    `json:"id"`
	Commit string    `json:"commit"`
	Time   time.Time `json:"time"`
}

func (s *session) logCommands() []*cobra.Command {
	var opts LogOptions
	logs := newCmd(groupLogs, "logs APP [-f] [-n N] [--process TYPE]", "Show what an app's processes print", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if opts.Lines < 0 {
			return fail("-n %d: give a number of lines from 1 up", opts.Lines)
		}
		if opts.Process != "" {
			if _, ok := app.Spec.Processes[opts.Process]; !ok {
				return fail("%s has no process type %q: its types are %v", app.Name, opts.Process, sortedKeys(app.Spec.Processes))
			}
		}
		if s.cfg.Logs == nil {
			return fail("this server cannot read runtime logs")
		}
		if err := s.cfg.Logs.Logs(s.ctx, app.Name, opts, s.out); err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			return fail("%v", err)
		}
		return nil
	})
	flags(logs).BoolVarP(&opts.Follow, "follow", "f", false, "keep printing new lines")
	flags(logs).IntVarP(&opts.Lines, "num", "n", 100, "recent lines of each instance to show first")
	flags(logs).StringVar(&opts.Process, "process", "", "only this process type")

	var asJSON bool
	builds := newCmd(groupLogs, "builds APP", "List an app's recent builds", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if s.cfg.Builds == nil {
			return fail("this server keeps no build logs")
		}
		list, err := s.cfg.Builds.List(app.Name)
		if err != nil {
			return err
		}
		out := []BuildInfo{}
		for _, b := range list {
			out = append(out, BuildInfo{ID: b.ID, Commit: b.Commit, Time: b.Time.UTC()})
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintf(s.out, "%s has no builds yet: git push builds it.\n", app.Name)
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "ID\tCOMMIT\tWHEN")
		for _, b := range out {
			fmt.Fprintf(w, "%s\t%.12s\t%s\n", b.ID, b.Commit, b.Time.Format(time.RFC3339))
		}
		return w.Flush()
	})
	jsonFlag(builds, &asJSON)

	buildLog := newCmd(groupLogs, "builds:logs APP [ID]", "Print the output of a build (default: the latest)", args(1, 2), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		if s.cfg.Builds == nil {
			return fail("this server keeps no build logs")
		}
		id := ""
		if len(a) == 2 {
			id = a[1]
		} else {
			list, err := s.cfg.Builds.List(app.Name)
			if err != nil {
				return err
			}
			if len(list) == 0 {
				return fail("%s has no builds yet: git push builds it", app.Name)
			}
			id = list[0].ID
		}
		f, err := s.cfg.Builds.Open(app.Name, id)
		if errors.Is(err, fs.ErrNotExist) {
			return fail("%s has no build %q (builds %s lists them)", app.Name, id, app.Name)
		}
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(s.out, f)
		return err
	})
	return []*cobra.Command{logs, builds, buildLog}
}
