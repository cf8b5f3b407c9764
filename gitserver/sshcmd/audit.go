package sshcmd

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/backend"
)

// auditCommands are what bex knows of an app besides its logs: who changed
// what (audit) and what the edge answered for it (metrics).
func (s *session) auditCommands() []*cobra.Command {
	var asJSON bool
	var before uint64
	var limit int
	trail := newCmd(groupLogs, "audit [APP] [--json] [--before N] [--limit N]", "Show who changed what, newest first (the audit trail)", args(0, 1), func(_ *cobra.Command, a []string) error {
		app := ""
		if len(a) == 1 {
			app = a[0]
		}
		if limit < 1 || limit > audit.MaxLimit {
			return fail("--limit %d: give 1 to %d entries a page", limit, audit.MaxLimit)
		}
		page, err := s.b.Audit(s.ctx, s.user, backend.AuditQuery{App: app, Before: before, Limit: limit})
		if err != nil {
			return err
		}
		if asJSON {
			return s.json(page)
		}
		if len(page.Entries) == 0 {
			of := ""
			if app != "" {
				of = " of " + app
			}
			if before != 0 {
				fmt.Fprintf(s.out, "Nothing%s was changed before entry %d.\n", of, before)
			} else {
				fmt.Fprintf(s.out, "Nothing%s was changed yet.\n", of)
			}
			return nil
		}
		w := s.table()
		fmt.Fprintln(w, "WHEN\tUSER\tVIA\tCOMMAND\tAPP\tRELEASE\tOUTCOME\tREASON/DETAILS")
		for _, e := range page.Entries {
			// The fields are printed as the store keeps them: it has replaced
			// their control characters (tabs and newlines included, which
			// would break the columns), and over ssh the trail is read by
			// the owners of what it describes, so nothing is framed.
			target := e.App
			if target == "" {
				target = e.Database
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339), e.User, viaLine(e), e.Command,
				target, releaseLine(e.ReleaseBefore, e.ReleaseAfter), e.Outcome, cut(whyLine(e), 80))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if page.Next != 0 {
			more := "audit"
			if app != "" {
				more += " " + app
			}
			fmt.Fprintf(s.out, "More: %s --before %d\n", more, page.Next)
		}
		return nil
	})
	jsonFlag(trail, &asJSON)
	flags(trail).Uint64Var(&before, "before", 0, "only entries older than this cursor (the More: line gives it)")
	flags(trail).IntVar(&limit, "limit", audit.DefaultLimit, fmt.Sprintf("entries a page (at most %d)", audit.MaxLimit))

	var metricsJSON bool
	metrics := newCmd(groupLogs, "metrics APP [--json]", "Show the requests the edge answered for an app over the last 5 and 60 minutes", args(1, 1), func(_ *cobra.Command, a []string) error {
		m, err := s.b.Metrics(s.ctx, s.user, a[0])
		if err != nil {
			return err
		}
		if metricsJSON {
			return s.json(m)
		}
		w := s.table()
		fmt.Fprintln(w, "WINDOW\tREQUESTS\t4XX\t5XX\tP50\tP95")
		for _, tw := range m.Windows {
			fmt.Fprintf(w, "%dm\t%d\t%s\t%s\t%s\t%s\n", tw.Minutes, tw.Requests, share(tw.Status4xx, tw.Requests), share(tw.Status5xx, tw.Requests),
				millis(tw.P50, tw.Requests), millis(tw.P95, tw.Requests))
		}
		return w.Flush()
	})
	jsonFlag(metrics, &metricsJSON)
	return []*cobra.Command{trail, metrics}
}

// viaLine is the way an entry's change came in; for an agent, the name of
// its token, which tells one agent from another.
func viaLine(e backend.AuditEntry) string {
	if e.Via == backend.ViaMCP && e.Token != "" {
		return fmt.Sprintf("%s (token %s)", e.Via, e.Token)
	}
	return e.Via
}

// releaseLine is "v3 → v4" for a change that made v4 over v3, "v4" for the
// first release, "v3 → -" for one that made none over v3 (a failed deploy),
// and empty for a change of no release.
func releaseLine(before, after int64) string {
	switch {
	case before != 0 && after != 0:
		return fmt.Sprintf("v%d → v%d", before, after)
	case after != 0:
		return fmt.Sprintf("v%d", after)
	case before != 0:
		return fmt.Sprintf("v%d → -", before)
	}
	return ""
}

// whyLine is the last column: a failure's error (what the reader of a failed
// change wants first), else the reason given, else the details as k=v,
// sorted by key.
func whyLine(e backend.AuditEntry) string {
	if e.Outcome == "failed" && e.Error != "" {
		return e.Error
	}
	if e.Reason != "" {
		return e.Reason
	}
	keys := make([]string, 0, len(e.Details))
	for k := range e.Details {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + e.Details[k]
	}
	return strings.Join(parts, " ")
}

// cut shortens s to at most n runes, marking the cut with "…"; --json has the
// whole of it.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// share is a count of responses and its part of all: "3 (1.5%)".
func share(n, of int64) string {
	if of == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%.1f%%)", n, float64(n)*100/float64(of))
}

// millis is a latency in seconds as milliseconds, "-" for a window without
// requests, whose quantiles are no measurement.
func millis(seconds float64, requests int64) string {
	if requests == 0 {
		return "-"
	}
	ms := seconds * 1000
	if ms < 10 {
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}
