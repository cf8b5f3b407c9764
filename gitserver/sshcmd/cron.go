package sshcmd

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// exitText is a run's exit status for people: "exit 2", or "none yet".
func exitText(code *int32) string {
	if code == nil {
		return "none yet"
	}
	if *code < 0 {
		return "could not start"
	}
	return fmt.Sprintf("exit %d", *code)
}

// cronLine cuts a tenant's command to one line of at most n characters.
func cronLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}

func timeText(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func (s *session) cronCommands() []*cobra.Command {
	var asJSON bool
	list := newCmd(groupRun, "cron APP [--json]", "List an app's cron jobs: schedule, last run, its exit status, next run", args(1, 1), func(_ *cobra.Command, a []string) error {
		jobs, err := s.b.Cron(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(jobs)
		}
		if len(jobs) == 0 {
			fmt.Fprintf(s.out, "%s has no cron jobs: app.json's \"cron\" declares them.\n", a[0])
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "ID\tSCHEDULE\tLAST RUN\tLAST EXIT\tNEXT RUN\tPOLICY\tCOMMAND")
		for _, j := range jobs {
			last := exitText(j.LastExitCode)
			if j.Running > 0 {
				last += fmt.Sprintf(" (%d running)", j.Running)
			}
			if j.Failing {
				last += fmt.Sprintf(" FAILING ×%d", j.ConsecutiveFailures)
			}
			next := timeText(j.NextRun)
			if j.Error != "" {
				next = j.Error
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, cronLine(j.Schedule, 40), timeText(j.LastRun), last, cronLine(next, 60), j.ConcurrencyPolicy, cronLine(j.Command, 60))
		}
		return w.Flush()
	})
	jsonFlag(list, &asJSON)

	run := newCmd(groupRun, "cron:run APP ID", "Start one run of a cron job now (its output: logs APP --process cron.ID)", args(2, 2), func(_ *cobra.Command, a []string) error {
		if err := s.b.CronRun(s.ctx, s.user, a[0], a[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Starting cron job %s of %s: its output is in logs %s --process cron.%s\n", a[1], a[0], a[0], a[1])
		return nil
	})
	return []*cobra.Command{list, run}
}
