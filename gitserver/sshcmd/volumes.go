package sshcmd

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/bytesize"
)

// volumeCommands are an app's volumes: list, create, destroy, backup, restore.
func (s *session) volumeCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupApps, "volumes APP", "List an app's volumes and their use", args(1, 1), func(_ *cobra.Command, a []string) error {
		out, err := s.b.Volumes(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(out)
		}
		if len(out) == 0 {
			fmt.Fprintf(s.out, "%s has no volumes: volumes:create %s NAME --path /data makes one.\n", a[0], a[0])
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "NAME\tPATH\tSIZE\tUSED\tPROCESSES\tSTATE")
		for _, v := range out {
			used := "-"
			if v.UsedBytes != nil {
				used = bytesize.Format(*v.UsedBytes)
			}
			procs := "all"
			if len(v.Processes) > 0 {
				procs = strings.Join(v.Processes, ",")
			}
			state := "ready"
			switch {
			case !v.Ready:
				state = v.Message
			case v.Message != "":
				state = "ready; " + v.Message
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Path, v.Size, used, procs, state)
		}
		return w.Flush()
	})
	jsonFlag(list, &asJSON)

	var req backend.VolumeRequest
	var createJSON bool
	create := newCmd(groupApps, "volumes:create APP NAME --path PATH [--size 10Gi] [--process TYPE]...", "Add a volume: files that outlive the app's instances", args(2, 2), func(_ *cobra.Command, a []string) error {
		req.Name = a[1]
		progress := func(line string) { fmt.Fprintf(s.errOut, "-----> %s\n", line) }
		if createJSON {
			progress = nil
		}
		in, err := s.b.CreateVolume(s.ctx, s.user, a[0], req, progress)
		if err != nil {
			return err
		}
		if createJSON {
			return s.json(in)
		}
		if !in.Ready {
			fmt.Fprintf(s.out, "Added the volume %s (%s) to %s at %s: %s.\n", in.Name, in.Size, a[0], in.Path, in.Message)
			return nil
		}
		fmt.Fprintf(s.out, "Created the volume %s (%s) of %s, mounted at %s.\n", in.Name, in.Size, a[0], in.Path)
		return nil
	})
	flags(create).StringVar(&req.Path, "path", "", "where it is mounted in the app, e.g. /data (required)")
	flags(create).StringVar(&req.Size, "size", "", "its size, from 16Mi to 16Ti (default 1Gi); writes beyond it fail with ENOSPC")
	flags(create).StringSliceVar(&req.Processes, "process", nil, "a process type that mounts it (repeat for more; default: all)")
	jsonFlag(create, &createJSON)

	var confirm string
	destroy := newCmd(groupApps, "volumes:destroy APP NAME --confirm NAME", "Delete a volume and its files", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.DestroyVolume(s.ctx, s.user, a[0], a[1], confirm); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Destroyed the volume %s of %s: its files are gone.\n", a[1], a[0])
		return nil
	})
	flags(destroy).StringVar(&confirm, "confirm", "", "the volume's name again, to confirm")

	notice := func(line string) { fmt.Fprintln(s.errOut, line) }
	var backupLive, restoreLive bool
	backup := newCmd(groupApps, "volumes:backup APP NAME [--live] > backup.tar", "Write a volume's files as a tar archive, the app paused meanwhile (on a cluster: suspend it first, or --live)", args(2, 2), func(_ *cobra.Command, a []string) error {
		return s.b.BackupVolume(s.ctx, s.user, a[0], a[1], s.out, backupLive, notice)
	})
	flags(backup).BoolVar(&backupLive, "live", false, "on a cluster, copy while the app runs (writes in flight can be missed)")
	restore := newCmd(groupApps, "volumes:restore APP NAME [--live] < backup.tar", "Replace a volume's files with a tar archive's, the app paused meanwhile (on a cluster: suspend it first, or --live)", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.RestoreVolume(s.ctx, s.user, a[0], a[1], s.stdin, restoreLive, notice); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Restored the volume %s of %s.\n", a[1], a[0])
		return nil
	})
	flags(restore).BoolVar(&restoreLive, "live", false, "on a cluster, restore while the app runs")
	return []*cobra.Command{list, create, destroy, backup, restore}
}
