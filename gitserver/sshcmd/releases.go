package sshcmd

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/deployer/releases"
)

// ReleaseInfo is one release in `releases --json`, newest first.
type ReleaseInfo struct {
	Number      int64     `json:"number"`
	Cause       string    `json:"cause"`
	Actor       string    `json:"actor"`
	Description string    `json:"description"`
	Image       string    `json:"image"`
	Commit      string    `json:"commit"`
	RollbackOf  int64     `json:"rollbackOf,omitempty"`
	Created     time.Time `json:"created"`
	// Current is the release the app's spec names; Serving the one that serves.
	Current bool `json:"current"`
	Serving bool `json:"serving"`
	// Failed says why the release never served (its rollout failed and it was
	// withdrawn); empty for the others.
	Failed string `json:"failed,omitempty"`
}

func (s *session) releaseCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupRun, "releases APP", "List an app's releases, newest first", args(1, 1), func(_ *cobra.Command, a []string) error {
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		rels, err := s.cfg.Releases.List(s.ctx, app.Name)
		if err != nil {
			return fmt.Errorf("listing the releases of %s: %w", app.Name, err)
		}
		out := []ReleaseInfo{}
		for _, r := range rels {
			out = append(out, ReleaseInfo{Number: r.Spec.Number, Cause: string(r.Spec.Cause), Actor: r.Spec.Actor,
				Description: r.Spec.Description, Image: r.Spec.Image, Commit: r.Spec.Commit, RollbackOf: r.Spec.RollbackOf,
				Created: r.CreationTimestamp.UTC(), Current: r.Spec.Number == app.Spec.Release, Serving: r.Spec.Number == app.Status.Revision,
				Failed: r.Annotations[releases.AnnotationFailed]})
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintf(s.out, "%s has no releases yet: git push deploys it.\n", app.Name)
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
		app, err := s.app(a[0])
		if err != nil {
			return err
		}
		var to int64
		if len(a) == 2 {
			n, err := strconv.ParseInt(strings.TrimPrefix(a[1], "v"), 10, 64)
			if err != nil || n < 1 {
				return fail("%q is not a release: give its number, e.g. rollback %s v3 (releases %s lists them)", a[1], app.Name, app.Name)
			}
			to = n
		}
		if to, err = s.ops.RollbackTarget(s.ctx, app, to); err != nil {
			return err
		}
		n, err := s.cfg.Releases.Rollback(s.ctx, app.Name, to, s.user.Name)
		if err != nil {
			return fmt.Errorf("recording the rollback of %s: %w", app.Name, err)
		}
		s.audit("rollback", app.Name, "to", to, "release", n)
		fmt.Fprintf(s.out, "Rolled %s back to v%d: release v%d.\n", app.Name, to, n)
		return s.await(app.Name, n, detach)
	})
	flags(rollback).BoolVar(&detach, "detach", false, "return once the release is recorded, without waiting for it to serve")
	return []*cobra.Command{list, rollback}
}
