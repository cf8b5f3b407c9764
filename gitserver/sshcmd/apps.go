package sshcmd

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/internal/bytesize"
)

func (s *session) appCommands() []*cobra.Command {
	create := newCmd(groupApps, "apps:create NAME", "Create an app (then: git push)", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.CreateApp(s.ctx, s.user, a[0]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Created app %s. Deploy it with:\n  git remote add bex %s/%s\n  git push bex main\n", a[0], s.b.Host(), a[0])
		return nil
	})

	var asJSON bool
	list := newCmd(groupApps, "apps:list", "List the apps you can use", args(0, 0), func(*cobra.Command, []string) error {
		out, err := s.b.Apps(s.ctx, s.user)
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintln(s.out, "No apps yet: apps:create NAME, or git push to a new name.")
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tPHASE\tRELEASE\tURL")
		for _, a := range out {
			rev := "-"
			if a.Revision > 0 {
				rev = fmt.Sprintf("v%d", a.Revision)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Name, a.Phase, rev, a.URL)
		}
		return w.Flush()
	})
	list.Aliases = []string{"apps"}
	jsonFlag(list, &asJSON)

	var infoJSON bool
	info := newCmd(groupApps, "apps:info APP", "Show an app", args(1, 1), func(_ *cobra.Command, a []string) error {
		in, err := s.b.App(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if infoJSON {
			return s.json(in)
		}
		w := s.table()
		rows := [][2]string{
			{"Name", in.Name}, {"Phase", in.Phase}, {"URL", in.URL}, {"Git", in.GitURL},
			{"Release", fmt.Sprintf("v%d (serving: v%d)", in.Release, in.Revision)},
			{"Image", in.Image}, {"Deploy branch", in.DeployBranch},
			{"Suspended", fmt.Sprint(in.Suspended)},
			{"Members", strings.Join(in.Members, ", ")}, {"Domains", strings.Join(in.Domains, ", ")},
			{"Created", in.Created.Format(time.RFC3339)},
		}
		for _, p := range in.Processes {
			rows = append(rows, [2]string{"Process " + p.Type, fmt.Sprintf("%d × %s (%s)", p.Replicas, commandLine(p.Command), limitsLine(p.Resources))})
		}
		if in.TroubleMessage != "" {
			rows = append(rows, [2]string{"Rollout", in.TroubleMessage})
		}
		for _, c := range in.Cron {
			if c.Failing {
				rows = append(rows, [2]string{"Cron " + c.ID, fmt.Sprintf("failing: %d runs in a row exited non-zero, last %s (%s)", c.ConsecutiveFailures, exitText(c.LastExitCode), cronLine(c.Command, 60))})
			}
		}
		if lr := in.LastRelease; lr != nil && lr.Failed != "" {
			// A rejected push or rollback is withdrawn, so the app is back on
			// what serves and Rollout says nothing: this says why.
			rows = append(rows, [2]string{"Last release", fmt.Sprintf("v%d failed: %s", lr.Number, lr.Failed)})
		}
		if lb := in.LastBuild; lb != nil {
			build := fmt.Sprintf("%s of %.12s at %s", lb.Result, lb.Commit, lb.Time.Format(time.RFC3339))
			if lb.Error != "" {
				build += ": " + lb.Error
			}
			rows = append(rows, [2]string{"Last build", build})
		}
		if d := in.Disk; d != nil {
			k := d.Kinds
			rows = append(rows, [2]string{"Disk", fmt.Sprintf("%s (images %s, build cache %s, build logs %s, logs %s, repository %s, volumes %s; reclaimable %s)",
				bytesize.Format(d.Bytes), bytesize.Format(k.Images), bytesize.Format(k.BuildCache), bytesize.Format(k.BuildLogs), bytesize.Format(k.Logs),
				bytesize.Format(k.Repository), bytesize.Format(k.Volumes), bytesize.Format(d.Reclaimable))})
		}
		for _, r := range rows {
			fmt.Fprintf(w, "%s:\t%s\n", r[0], r[1])
		}
		return w.Flush()
	})
	jsonFlag(info, &infoJSON)

	var confirm string
	destroy := newCmd(groupApps, "apps:destroy APP --confirm APP", "Delete an app, its processes, releases and repository", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.DestroyApp(s.ctx, s.user, a[0], confirm); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Destroyed %s: its processes stop and its releases go with it.\n", a[0])
		return nil
	})
	flags(destroy).StringVar(&confirm, "confirm", "", "the app's name again, to confirm")

	var whoJSON bool
	who := newCmd(groupAccess, "whoami", "Show who you are to this server", args(0, 0), func(*cobra.Command, []string) error {
		me := s.b.WhoAmI(s.user)
		if whoJSON {
			return s.json(me)
		}
		fmt.Fprintf(s.out, "%s (%s), key %s %s\n", me.Name, me.Role, me.Key, me.Fingerprint)
		return nil
	})
	jsonFlag(who, &whoJSON)
	return []*cobra.Command{create, list, info, destroy, who}
}

func (s *session) accessCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupAccess, "access:list APP", "List who may use an app besides admins", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Members(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out.Members) == 0 {
			fmt.Fprintf(s.out, "Only admins may use %s.\n", out.App)
		}
		for _, m := range out.Members {
			fmt.Fprintln(s.out, m)
		}
		return nil
	})
	jsonFlag(list, &asJSON)

	add := newCmd(groupAccess, "access:add APP USER", "Let a user push to and manage an app", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.AddMember(s.ctx, s.user, a[0], a[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s may now use %s.\n", a[1], a[0])
		return nil
	})

	remove := newCmd(groupAccess, "access:remove APP USER", "Take away a user's access to an app", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.RemoveMember(s.ctx, s.user, a[0], a[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s may no longer use %s.\n", a[1], a[0])
		return nil
	})
	return []*cobra.Command{list, add, remove}
}

func (s *session) json(v any) error {
	enc := json.NewEncoder(s.out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (s *session) table() *tabwriter.Writer {
	return tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
}
