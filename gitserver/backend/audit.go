package backend

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/audit"
)

// AuditEntry is one change of the audit trail (package audit).
type AuditEntry = audit.Entry

// The ways a change comes in, an audit entry's Via.
const (
	ViaSSH     = "ssh"
	ViaGit     = "git"
	ViaWebhook = "webhook"
	ViaMCP     = "mcp"
	// ViaBex is the platform's own schedules (a database's backups).
	ViaBex = "bex"
)

// via is the way u came in: an agent's token (the MCP server, the one front
// end that takes tokens) or an ssh key; a push says git itself.
func (u *User) via() (via, token string) {
	if name, ok := strings.CutPrefix(u.KeyName, "token:"); ok {
		return ViaMCP, name
	}
	return ViaSSH, ""
}

// entryOf is the audit entry of u's change op of app, with attrs as audit
// takes them.
func entryOf(u *User, op, app string, attrs []any) AuditEntry {
	e := AuditEntry{User: u.Name, Command: op, App: app, Client: u.Client, Reason: u.Reason}
	e.Via, e.Token = u.via()
	if u.KeyName != "" && e.Token == "" {
		e.Details = map[string]string{"key": u.KeyName}
	}
	addAttrs(&e, attrs)
	return e
}

// addAttrs puts audit's attrs into e: the releases before and after, the
// database, the rest as details.
func addAttrs(e *AuditEntry, attrs []any) {
	for i := 0; i+1 < len(attrs); i += 2 {
		k, _ := attrs[i].(string)
		v := attrs[i+1]
		switch k {
		case "before":
			e.ReleaseBefore, _ = v.(int64)
			continue
		case "release":
			if n, ok := v.(int64); ok {
				e.ReleaseAfter = n
				continue
			}
		case "database":
			if s, ok := v.(string); ok {
				e.Database = s
				continue
			}
		case "via":
			e.Via, _ = v.(string)
			continue
		case "error":
			e.Outcome, e.Error = "failed", fmt.Sprint(v)
			continue
		}
		if e.Details == nil {
			e.Details = map[string]string{}
		}
		switch v := v.(type) {
		case []string:
			e.Details[k] = strings.Join(v, ",")
		default:
			e.Details[k] = fmt.Sprint(v)
		}
	}
}

// keep appends e to the trail. A trail that cannot be written loses the
// entry, not the change: the change is made, and its log line says it.
func (b *Backend) keep(e AuditEntry) {
	if b.cfg.Audit == nil {
		return
	}
	if _, err := b.cfg.Audit.Append(e); err != nil {
		b.log.Error("keeping an audit entry", "command", e.Command, "app", e.App, "err", err)
	}
}

// AuditPage is a page of the audit trail, newest first.
type AuditPage struct {
	Entries []AuditEntry `json:"entries"`
	// Next is the cursor of the following (older) page: pass it as before;
	// 0 when there is none.
	Next uint64 `json:"next,omitempty" jsonschema:"the cursor of the next (older) page: pass it as before; absent when there is none"`
}

// AuditQuery selects a page of the trail.
type AuditQuery struct {
	// App, when set, keeps the entries of that app (u must be able to use it).
	App string
	// Before is the cursor: entries older than it (0: from the newest).
	Before uint64
	// Limit is the page's size (0: 50, at most 500).
	Limit int
}

// Audit is the audit trail as u may see it, newest first: the changes of the
// apps u may use now (a token's apps for a limited one) and of the databases
// u is a member of; u's own changes of nothing in particular (a token made)
// unless u's token is limited; every entry for an admin not through a
// limited token.
func (b *Backend) Audit(ctx context.Context, u *User, q AuditQuery) (*AuditPage, error) {
	if b.cfg.Audit == nil {
		return nil, Errorf(Invalid, "this server keeps no audit trail")
	}
	if q.App != "" {
		if _, err := b.app(ctx, u, q.App); err != nil {
			return nil, err
		}
	}
	var match func(AuditEntry) bool
	if u.wideAdmin() {
		match = func(e AuditEntry) bool { return q.App == "" || e.App == q.App }
	} else {
		apps, err := b.apps(ctx, u)
		if err != nil {
			return nil, err
		}
		mine := map[string]bool{}
		for _, a := range apps {
			mine[a.Name] = true
		}
		dbs := &appv1.DatabaseList{}
		if err := b.cfg.Reader.List(ctx, dbs, client.InNamespace(b.cfg.Namespace)); err != nil {
			return nil, fmt.Errorf("listing the databases: %w", err)
		}
		member := map[string]bool{}
		for _, d := range dbs.Items {
			if !u.Scope.Limited() && u.member(d.Spec.Members) {
				member[d.Name] = true
			}
		}
		match = func(e AuditEntry) bool {
			switch {
			case q.App != "":
				return e.App == q.App
			case e.App != "":
				return mine[e.App]
			case e.Database != "":
				return member[e.Database]
			}
			return !u.Scope.Limited() && e.User == u.Name
		}
	}
	entries, next, err := b.cfg.Audit.List(audit.Query{Before: q.Before, Limit: q.Limit, Match: match})
	if err != nil {
		return nil, fmt.Errorf("reading the audit trail: %w", err)
	}
	if entries == nil {
		entries = []AuditEntry{}
	}
	return &AuditPage{Entries: entries, Next: next}, nil
}
