package sshcmd

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func (s *session) releaseCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupRun, "releases APP", "List an app's releases, newest first", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, _, err := s.b.Releases(s.ctx, s.user, a[0], 0)
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintf(s.out, "%s has no releases yet: git push deploys it.\n", a[0])
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "RELEASE\tCAUSE\tBY\tWHEN\tDESCRIPTION")
		for _, r := range out {
			mark := ""
			if r.Serving {
				mark = " (serving)"
			} else if r.Failed != "" {
				mark = " (failed)"
			}
			fmt.Fprintf(w, "v%d%s\t%s\t%s\t%s\t%s\n", r.Number, mark, r.Cause, r.Actor, r.Created.Format(time.RFC3339), r.Description)
		}
		return w.Flush()
	})
	jsonFlag(list, &asJSON)

	var detach bool
	rollback := newCmd(groupRun, "rollback APP [vN]", "Run an older release's image and config again, as a new release", args(1, 2), func(_ *cobra.Command, a []string) error {
		var to int64
		if len(a) == 2 {
			n, err := strconv.ParseInt(strings.TrimPrefix(a[1], "v"), 10, 64)
			if err != nil || n < 1 {
				return fail("%q is not a release: give its number, e.g. rollback %s v3 (releases %s lists them)", a[1], a[0], a[0])
			}
			to = n
		}
		to, n, err := s.b.Rollback(s.ctx, s.user, a[0], to)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Rolled %s back to v%d: release v%d.\n", a[0], to, n)
		return s.await(a[0], n, detach)
	})
	flags(rollback).BoolVar(&detach, "detach", false, "return once the release is recorded, without waiting for it to serve")
	return []*cobra.Command{list, rollback}
}
