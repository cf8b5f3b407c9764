package sshcmd

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/bytesize"
)

// groupDatabases is the managed databases' commands.
const groupDatabases = "databases"

// databaseCommands are postgres:* and redis:*: the same commands for each
// engine (the backend checks that the database is of it), and the engine's
// own tools (psql, backup and restore; cli).
func (s *session) databaseCommands() []*cobra.Command {
	var out []*cobra.Command
	for _, e := range appv1.Engines {
		out = append(out, s.engineCommands(e)...)
	}
	return out
}

// engineTitle is the engine's name for people.
func engineTitle(e appv1.DatabaseEngine) string {
	if e == appv1.EngineRedis {
		return "Redis"
	}
	return "Postgres"
}

func (s *session) engineCommands(e appv1.DatabaseEngine) []*cobra.Command {
	p, title, envName := string(e)+":", engineTitle(e), appv1.LinkEnv(e)

	var req backend.DatabaseRequest
	var createJSON bool
	create := newCmd(groupDatabases, p+"create NAME [--version V] [--size 1Gi] [--memory 256Mi] [--instances N]", "Create a "+title+" database (then: "+p+"link NAME APP)", args(1, 1), func(_ *cobra.Command, a []string) error {
		req.Engine, req.Name = e, a[0]
		in, err := s.b.CreateDatabase(s.ctx, s.user, req)
		if err != nil {
			return err
		}
		if createJSON {
			return s.json(in)
		}
		fmt.Fprintf(s.out, "Creating the %s database %s (%s): %sinfo %s says when it runs; %slink %s APP gives an app its %s.\n", title, in.Name, in.Size, p, in.Name, p, in.Name, envName)
		return nil
	})
	flags(create).StringVar(&req.Version, "version", "", "the engine's major version, e.g. 16 (default: the platform's)")
	flags(create).StringVar(&req.Size, "size", "", "the disk of its data, from 16Mi to 16Ti (default 1Gi)")
	flags(create).StringVar(&req.Memory, "memory", "", "its server's memory limit, from 16Mi to 64Gi (default 256Mi)")
	flags(create).Int32Var(&req.Instances, "instances", 0, "how many servers run, 1 to 3 (where the platform runs more than one)")
	jsonFlag(create, &createJSON)

	var listJSON bool
	list := newCmd(groupDatabases, p+"list", "List the "+title+" databases you can use", args(0, 0), func(*cobra.Command, []string) error {
		dbs, err := s.b.Databases(s.ctx, s.user, e)
		if err != nil {
			return err
		}
		if listJSON {
			return s.json(dbs)
		}
		if len(dbs) == 0 {
			fmt.Fprintf(s.out, "No %s databases yet: %screate NAME makes one.\n", title, p)
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tVERSION\tSTATUS\tSIZE\tUSED\tLINKS")
		for _, d := range dbs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, orDash(d.Version), d.Status, d.Size, usedText(d.UsedBytes), orDash(strings.Join(d.Links, ",")))
		}
		return w.Flush()
	})
	list.Aliases = []string{string(e)}
	jsonFlag(list, &listJSON)

	var infoJSON bool
	info := newCmd(groupDatabases, p+"info NAME", "Show a "+title+" database: its status, address and links (never its password)", args(1, 1), func(_ *cobra.Command, a []string) error {
		in, err := s.b.Database(s.ctx, s.user, e, a[0])
		if err != nil {
			return err
		}
		if infoJSON {
			return s.json(in)
		}
		status := in.Status
		if in.Message != "" {
			status += ": " + in.Message
		}
		port := "-"
		if in.Port > 0 {
			port = fmt.Sprint(in.Port)
		}
		rows := [][2]string{{"Name", in.Name}, {"Engine", in.Engine}, {"Version", orDash(in.Version)}, {"Status", status},
			{"Host", orDash(in.Host)}, {"Port", port}}
		if e == appv1.EnginePostgres {
			rows = append(rows, [2]string{"Database", in.Database}, [2]string{"User", in.User})
		}
		rows = append(rows, [2]string{"Size", in.Size}, [2]string{"Used", usedText(in.UsedBytes)}, [2]string{"Memory", in.Memory},
			[2]string{"Instances", fmt.Sprint(in.Instances)}, [2]string{"Links", orDash(strings.Join(in.Links, ", "))},
			[2]string{"Members", strings.Join(in.Members, ", ")}, [2]string{"Created", in.Created.Format(time.RFC3339)})
		w := s.table()
		for _, r := range rows {
			fmt.Fprintf(w, "%s:\t%s\n", r[0], r[1])
		}
		return w.Flush()
	})
	jsonFlag(info, &infoJSON)

	var as string
	var linkDetach bool
	link := newCmd(groupDatabases, p+"link NAME APP [--as "+envName+"]", "Give an app the database's URL as a config var: one release, one restart", args(2, 2), func(_ *cobra.Command, a []string) error {
		res, err := s.b.LinkDatabase(s.ctx, s.user, e, a[0], a[1], as, s.errOut)
		if err != nil {
			return err
		}
		v := res.Vars[0]
		switch {
		case res.Description == "":
			fmt.Fprintf(s.out, "%s has %s from %s already: nothing to change.\n", res.App, v, res.Database)
			return nil
		case res.Release == 0:
			fmt.Fprintf(s.out, "Linked %s to %s as %s; the first deploy (git push) takes it.\n", res.Database, res.App, v)
			return nil
		}
		fmt.Fprintf(s.out, "Linked %s to %s as %s: release v%d.\n", res.Database, res.App, v, res.Release)
		return s.await(res.App, res.Release, linkDetach)
	})
	flags(link).StringVar(&as, "as", "", "the config var's name (default "+envName+")")
	flags(link).BoolVar(&linkDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")

	var unlinkDetach bool
	unlink := newCmd(groupDatabases, p+"unlink NAME APP", "Take the database's variables out of an app's config: one release, one restart", args(2, 2), func(_ *cobra.Command, a []string) error {
		res, err := s.b.UnlinkDatabase(s.ctx, s.user, e, a[0], a[1], s.errOut)
		if err != nil {
			return err
		}
		if res.Release == 0 {
			fmt.Fprintf(s.out, "Unlinked %s from %s (%s); the first deploy (git push) takes it.\n", res.Database, res.App, strings.Join(res.Vars, ", "))
			return nil
		}
		fmt.Fprintf(s.out, "Unlinked %s from %s (%s): release v%d.\n", res.Database, res.App, strings.Join(res.Vars, ", "), res.Release)
		return s.await(res.App, res.Release, unlinkDetach)
	})
	flags(unlink).BoolVar(&unlinkDetach, "detach", false, "return once the release is recorded, without waiting for it to serve")

	var confirm string
	destroy := newCmd(groupDatabases, p+"destroy NAME --confirm NAME", "Delete a "+title+" database and its data (refused while linked)", args(1, 1), func(_ *cobra.Command, a []string) error {
		if err := s.b.DestroyDatabase(s.ctx, s.user, e, a[0], confirm); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Destroyed %s: its server stops and its data is deleted.\n", a[0])
		return nil
	})
	flags(destroy).StringVar(&confirm, "confirm", "", "the database's name again, to confirm")

	shellUse, shellShort := "psql NAME", "Run psql on the database: SQL from stdin, or interactive under ssh -t"
	if e == appv1.EngineRedis {
		shellUse, shellShort = "cli NAME", "Run redis-cli on the database: commands from stdin, or interactive under ssh -t"
	}
	shell := newCmd(groupDatabases, p+shellUse, shellShort, args(1, 1), func(_ *cobra.Command, a []string) error {
		dio := backend.DatabaseIO{Stdin: s.stdin, Stdout: s.out, Stderr: s.errOut, TTY: s.tty}
		if s.tty != nil {
			dio.Stderr = s.out // one stream on a terminal
		}
		exit, err := s.b.DatabaseShell(s.ctx, s.user, e, a[0], dio)
		if err != nil {
			return err
		}
		s.exit = exit
		return nil
	})
	cmds := append([]*cobra.Command{create, list, info, link, unlink, shell, destroy}, s.databaseAccessCommands(e)...)
	if e != appv1.EnginePostgres {
		return cmds
	}

	// A dump is bytes: it goes to stdout alone, and never through a terminal.
	backup := newCmd(groupDatabases, p+"backup NAME > dump", "Write a dump of the database (pg_dump's custom format) to stdout", args(1, 1), func(_ *cobra.Command, a []string) error {
		return s.b.BackupDatabase(s.ctx, s.user, a[0], s.out, s.errOut)
	})
	var backupID string
	restore := newCmd(groupDatabases, p+"restore NAME [--backup ID] < dump", "Replace the database's contents with a dump from stdin, or a backup kept here, in one transaction: a restore that fails changes nothing", args(1, 1), func(_ *cobra.Command, a []string) error {
		if backupID != "" {
			if err := s.b.RestoreDatabaseBackup(s.ctx, s.user, a[0], backupID, s.errOut); err != nil {
				return err
			}
			fmt.Fprintf(s.out, "Restored %s from its backup %s.\n", a[0], backupID)
			return nil
		}
		if err := s.b.RestoreDatabase(s.ctx, s.user, a[0], s.stdin, s.errOut); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Restored %s from the dump.\n", a[0])
		return nil
	})
	flags(restore).StringVar(&backupID, "backup", "", "a backup kept on the server ("+p+"backups NAME lists them) instead of stdin")

	var backupsJSON bool
	backups := newCmd(groupDatabases, p+"backups NAME", "List the database's backups kept on the server, and its schedule", args(1, 1), func(_ *cobra.Command, a []string) error {
		in, err := s.b.DatabaseBackups(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if backupsJSON {
			return s.json(in)
		}
		next := "never: " + in.ScheduleError
		if in.Next != nil {
			next = in.Next.Format(time.RFC3339)
		}
		fmt.Fprintf(s.out, "Schedule: %s (UTC), %d kept; next: %s\n", in.Schedule, in.Keep, next)
		if len(in.Backups) == 0 {
			fmt.Fprintf(s.out, "No backups yet: %sbackups:capture %s takes one now.\n", p, a[0])
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "ID\tKIND\tCREATED\tSIZE")
		for _, b := range in.Backups {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", b.ID, b.Kind, b.Created.Format(time.RFC3339), bytesize.Format(b.Bytes))
		}
		return w.Flush()
	})
	jsonFlag(backups, &backupsJSON)

	var captureJSON bool
	capture := newCmd(groupDatabases, p+"backups:capture NAME", "Take a backup of the database now and keep it on the server", args(1, 1), func(_ *cobra.Command, a []string) error {
		bk, err := s.b.CaptureDatabaseBackup(s.ctx, s.user, a[0], s.errOut)
		if err != nil {
			return err
		}
		if captureJSON {
			return s.json(bk)
		}
		fmt.Fprintf(s.out, "Backup %s of %s taken (%s): %srestore %s --backup %s brings it back.\n", bk.ID, a[0], bytesize.Format(bk.Bytes), p, a[0], bk.ID)
		return nil
	})
	jsonFlag(capture, &captureJSON)
	return append(cmds, backup, restore, backups, capture)
}

// databaseAccessCommands are postgres:access:* and redis:access:*: who may
// use a database besides admins, as access:* for an app.
func (s *session) databaseAccessCommands(e appv1.DatabaseEngine) []*cobra.Command {
	p, title := string(e)+":", engineTitle(e)

	var asJSON bool
	list := newCmd(groupDatabases, p+"access:list NAME", "List who may use a "+title+" database besides admins", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.DatabaseMembers(s.ctx, s.user, e, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out.Members) == 0 {
			fmt.Fprintf(s.out, "Only admins may use %s.\n", out.Database)
		}
		for _, m := range out.Members {
			fmt.Fprintln(s.out, m)
		}
		return nil
	})
	jsonFlag(list, &asJSON)

	add := newCmd(groupDatabases, p+"access:add NAME USER", "Let a user see, link and use a "+title+" database", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.AddDatabaseMember(s.ctx, s.user, e, a[0], a[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s may now use %s.\n", a[1], a[0])
		return nil
	})

	remove := newCmd(groupDatabases, p+"access:remove NAME USER", "Take away a user's access to a "+title+" database (its links stay)", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.RemoveDatabaseMember(s.ctx, s.user, e, a[0], a[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s may no longer use %s.\n", a[1], a[0])
		return nil
	})
	return []*cobra.Command{list, add, remove}
}

func orDash(v string) string {
	if v == "" {
		return "-"
	}
	return v
}

func usedText(used *int64) string {
	if used == nil {
		return "-"
	}
	return bytesize.Format(*used)
}
