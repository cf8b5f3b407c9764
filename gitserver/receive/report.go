package receive

import (
	"io"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
)

// Result is the outcome of one command. An empty Reason means the ref was updated;
// otherwise git prints "! [remote rejected] <ref> (<Reason>)".
type Result struct {
	Name   plumbing.ReferenceName
	Reason string
}

// WriteReport writes report-status: the unpack result and one line per command.
// unpackErr is nil when the pack was stored.
func WriteReport(w io.Writer, unpackErr error, results []Result) error {
	rs := packp.NewReportStatus()
	rs.UnpackStatus = "ok"
	if unpackErr != nil {
		rs.UnpackStatus = oneLine(unpackErr.Error())
	}
	for _, res := range results {
		status := "ok"
		if res.Reason != "" {
			status = oneLine(res.Reason)
		}
		rs.CommandStatuses = append(rs.CommandStatuses, &packp.CommandStatus{ReferenceName: res.Name, Status: status})
	}
	return rs.Encode(w)
}

// oneLine keeps a reason on one pkt-line: git prints it inside parentheses.
func oneLine(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		s = "rejected"
	}
	return s
}
