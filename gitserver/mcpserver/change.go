package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/untrusted"
)

// Change are the arguments every changing tool takes, embedded in its own:
// addTool refuses to register a changing tool without them, so that no tool
// is left without a dry run or a reason.
type Change struct {
	DryRun bool   `json:"dry_run,omitempty" jsonschema:"true: change nothing, and answer what the call would change (in plan), after the same checks and refusals as the call itself"`
	Reason string `json:"reason,omitempty" jsonschema:"why you make this change, in a sentence: kept in the app's audit trail with your token's and client's names"`
}

func (c Change) change() Change { return c }

// changer is an argument type that embeds Change.
type changer interface{ change() Change }

// Planned is in the result of every changing tool: a dry run's plan.
type Planned struct {
	Plan *backend.Plan `json:"plan,omitempty" jsonschema:"with dry_run: what the call would change; nothing was changed"`
}

func (p *Planned) planned(plan *backend.Plan) { p.Plan = plan }

// planner is a result type that embeds Planned (through a pointer to it).
type planner interface{ planned(*backend.Plan) }

// StatusDryRun is the verdict's status of a dry run: nothing ran.
const StatusDryRun = "dry_run"

// planned is a dry run's result for the tools that make a release: the plan,
// and a verdict that says nothing ran and which release serves.
func (d *Deployed) planned(plan *backend.Plan) {
	d.Plan = plan
	d.Status, d.ServingRelease = StatusDryRun, plan.ServingRelease
	d.Hint = "Nothing was changed: call again without dry_run to make this change."
}

// maxReasonBytes bounds a change's reason: it is kept in the audit trail.
const maxReasonBytes = 500

// withCall is u as this call acts: the client the session named at its start
// and the reason the call gives, for the audit trail. u is copied: the user
// the token verified stays as it was.
func withCall(u *backend.User, session *mcp.ServerSession, c Change) (*backend.User, error) {
	if len(c.Reason) > maxReasonBytes {
		return nil, backend.Errorf(backend.Invalid, "reason: at most %d bytes, a sentence", maxReasonBytes)
	}
	call := *u
	call.Reason = untrusted.Clean(c.Reason)
	if session != nil {
		if p := session.InitializeParams(); p != nil && p.ClientInfo != nil {
			call.Client = strings.TrimSpace(untrusted.Clean(p.ClientInfo.Name + " " + p.ClientInfo.Version))
		}
	}
	return &call, nil
}

// dryRun runs h as a dry run (backend.DryRun): what it would change, in its
// result's plan, changing nothing.
func dryRun[In, Out any](ctx context.Context, u *backend.User, name string, in In, h handler[In, Out]) (Out, string, error) {
	var out Out
	plan, err := backend.DryRun(ctx, func(ctx context.Context) error {
		_, _, err := h(ctx, u, in)
		return err
	})
	if err != nil {
		return out, "", err
	}
	any(&out).(planner).planned(plan)
	if len(plan.Changes) == 0 {
		return out, fmt.Sprintf("Dry run of %s: nothing would change.", name), nil
	}
	return out, fmt.Sprintf("Dry run of %s, nothing was changed: it %s.", name, strings.Join(plan.Changes, "; ")), nil
}

// checkChanging panics when a changing tool's arguments do not embed Change or
// its result does not embed Planned: every changing tool takes dry_run and
// reason.
func checkChanging[In, Out any](name string) {
	var in In
	if _, ok := any(in).(changer); !ok {
		panic(fmt.Sprintf("mcpserver: the changing tool %s's arguments do not embed Change (dry_run, reason)", name))
	}
	var out Out
	if _, ok := any(&out).(planner); !ok {
		panic(fmt.Sprintf("mcpserver: the changing tool %s's result does not embed Planned (a dry run's plan)", name))
	}
}
