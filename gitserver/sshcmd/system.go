package sshcmd

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/bytesize"
)

// groupSystem is the machine's own commands (admins).
const groupSystem = "system"

func (s *session) systemCommands() []*cobra.Command {
	var dfJSON bool
	df := newCmd(groupSystem, "system:df", "Show the disk each app and the platform use, and what is reclaimable (admins)", args(0, 0), func(*cobra.Command, []string) error {
		du, err := s.b.DiskUsage(s.ctx, s.user)
		if err != nil {
			return err
		}
		if dfJSON {
			return s.json(du)
		}
		w := s.table()
		fmt.Fprintln(w, "APP\tIMAGES\tBUILD CACHE\tBUILD LOGS\tLOGS\tREPOSITORY\tVOLUMES\tOTHER\tTOTAL\tRECLAIMABLE")
		row := func(name string, a backend.AppUsage) {
			k := a.Kinds
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, bytesize.Format(k.Images), bytesize.Format(k.BuildCache),
				bytesize.Format(k.BuildLogs), bytesize.Format(k.Logs), bytesize.Format(k.Repository), bytesize.Format(k.Volumes), bytesize.Format(k.Other),
				bytesize.Format(a.Bytes), reclaimable(a.Reclaimable, a.Bytes))
		}
		for _, a := range du.Apps {
			row(a.App, a)
		}
		row("(platform)", du.Platform)
		fmt.Fprintf(w, "TOTAL\t\t\t\t\t\t\t\t%s\t%s\n", bytesize.Format(du.Bytes), reclaimable(du.Reclaimable, du.Bytes))
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "\nState dir %s: %s on disk; its file system has %s free of %s.\n", du.StateDir,
			bytesize.Format(du.StateDirBytes), bytesize.Format(du.FileSystem.Free), bytesize.Format(du.FileSystem.Size))
		if du.BuildCacheShared > 0 {
			fmt.Fprintf(s.out, "BuildKit also holds %s of cache records whose layers are images' (counted as images, their snapshots as other).\n", bytesize.Format(du.BuildCacheShared))
		}
		for _, n := range du.NotMeasured {
			fmt.Fprintf(s.out, "Not measured: %s\n", n)
		}
		if du.Reclaimable > 0 {
			fmt.Fprintln(s.out, "system:prune frees what is reclaimable (system:prune --dry-run lists it).")
		}
		return nil
	})
	jsonFlag(df, &dfJSON)

	var dry, pruneJSON bool
	prune := newCmd(groupSystem, "system:prune", "Remove what is reclaimable now: unused images, unused build cache, unreachable git objects (admins)", args(0, 0), func(*cobra.Command, []string) error {
		rep, err := s.b.Prune(s.ctx, s.user, dry)
		if err != nil && rep == nil {
			return err
		}
		if pruneJSON {
			if jerr := s.json(rep); jerr != nil {
				return jerr
			}
			return err
		}
		verb, sum := "Removed", "Freed"
		if rep.DryRun {
			verb, sum = "Would remove", "Would free"
		}
		w := s.table()
		if len(rep.Items) > 0 {
			fmt.Fprintln(w, "APP\tKIND\tWHAT\tBYTES")
			for _, it := range rep.Items {
				app := it.App
				if app == "" {
					app = "(platform)"
				}
				b := bytesize.Format(it.Bytes)
				if it.Kind == "repository" && rep.DryRun {
					b = "?"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", app, it.Kind, visible(it.What), b)
			}
			if ferr := w.Flush(); ferr != nil {
				return ferr
			}
		}
		fmt.Fprintf(s.out, "%s %d item(s). %s %s.\n", verb, len(rep.Items), sum, bytesize.Format(rep.Bytes))
		for _, sk := range rep.Skipped {
			fmt.Fprintf(s.out, "Skipped: %s\n", sk)
		}
		return err
	})
	prune.Flags().BoolVar(&dry, "dry-run", false, "list what would be removed and how many bytes, and remove nothing")
	jsonFlag(prune, &pruneJSON)
	return []*cobra.Command{df, prune}
}

func reclaimable(r, of int64) string {
	if of <= 0 || r <= 0 {
		return "0 B"
	}
	return fmt.Sprintf("%s (%d%%)", bytesize.Format(r), r*100/of)
}

// visible is s with every rune that is not graphic (escape sequences, tabs,
// newlines) written as a Go escape (\x1b, \t, \u200b): a prune item's
// description is BuildKit's name of a build step, which is a tenant's RUN line,
// and printed raw it would reach an admin's terminal (an escape sequence that
// retitles the window or writes the clipboard) or break the table's columns.
func visible(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) }) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsGraphic(r):
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}
