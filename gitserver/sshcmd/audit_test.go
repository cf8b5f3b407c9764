package sshcmd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/audit"
	"bex.co/bex/gitserver/backend"
)

// openAudit is a real audit trail in a directory of the test's.
func openAudit(t *testing.T) *audit.Store {
	t.Helper()
	st, err := audit.Open(audit.DefaultOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// auditRow is a row of the audit table: WHEN, USER, VIA, COMMAND, APP, then
// the rest of the line (RELEASE, OUTCOME, REASON/DETAILS).
var auditRow = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s+(\S+)\s+(ssh|git|webhook|bex|mcp \(token [^)]+\)|mcp)\s+(\S+)\s+(\S*)\s+(.*)$`)

// commandsOf are the COMMAND and APP of the rows of an audit table, as
// "command app", and its More: line's cursor (0: none).
func commandsOf(t *testing.T, out string) ([]string, uint64) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !regexp.MustCompile(`^WHEN\s+USER\s+VIA\s+COMMAND\s+APP\s+RELEASE\s+OUTCOME\s+REASON/DETAILS$`).MatchString(lines[0]) {
		t.Fatalf("the audit table's header:\n%s", out)
	}
	var got []string
	var next uint64
	for i, l := range lines[1:] {
		if more, ok := strings.CutPrefix(l, "More: "); ok && i == len(lines)-2 {
			m := regexp.MustCompile(`^audit (?:\S+ )?--before (\d+)$`).FindStringSubmatch(more)
			if m == nil {
				t.Fatalf("the More: line %q", l)
			}
			next, _ = strconv.ParseUint(m[1], 10, 64)
			continue
		}
		m := auditRow.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("audit row %q is not WHEN USER VIA COMMAND APP ...:\n%s", l, out)
		}
		got = append(got, m[4]+" "+m[5])
	}
	return got, next
}

// TestAuditOverSSH, with the real ssh client against the real gitserver on a
// real API server and a real audit trail: changes made by two members through
// the commands are listed by audit, newest first, each with its user, via ssh,
// its command and app; a member sees only the changes of the apps they may
// use (audit of another's app is refused as any read of it), an admin every
// one (the control that the members' trails are cut, not empty); audit APP
// keeps that app's; --limit 1 pages with the More: line's --before, to the
// end; --json is an AuditPage. An agent's failed change shows its token's
// name, its releases and its error cut in the table, whole in --json.
func TestAuditOverSSH(t *testing.T) {
	st := openAudit(t)
	s := newServer(t, func(c *backend.Config) { c.Audit = st })
	ctx := context.Background()
	admin := s.addUser("admin", appv1.RoleAdmin, false)
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)
	dave := s.addUser("dave", appv1.RoleMember, false)

	if out := dave.ok("", "audit"); out != "Nothing was changed yet.\n" {
		t.Errorf("audit of an empty trail: %q", out)
	}

	// The changes, bob's and carol's interleaved.
	bob.ok("", "apps:create", "shop")
	carol.ok("", "apps:create", "cart")
	bob.ok("", "config:set", "shop", "A=1") // no image yet: the spec only, and an entry
	carol.ok("", "config:set", "cart", "B=2")
	a := s.app("shop")
	a.Spec.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1}}
	if err := s.cp.Client.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	s.eventually(func() error {
		if _, errOut, code := bob.ssh("", "ps:scale", "shop", "web=2"); code != 0 {
			return errors.New(errOut)
		}
		return nil
	})
	bob.ok("", "suspend", "shop")
	carol.ok("", "suspend", "cart")
	bob.ok("", "resume", "shop")
	bobs := []string{"resume shop", "suspend shop", "ps:scale shop", "config:set shop", "apps:create shop"}
	carols := []string{"suspend cart", "config:set cart", "apps:create cart"}

	// The table, newest first.
	out := bob.ok("", "audit")
	if got, next := commandsOf(t, out); !slices.Equal(got, bobs) || next != 0 {
		t.Errorf("bob's audit: %v (More: %d), want %v:\n%s", got, next, bobs, out)
	}
	for _, l := range strings.Split(out, "\n")[1:6] {
		if m := auditRow.FindStringSubmatch(l); m[2] != bob.name || m[3] != "ssh" || !strings.HasPrefix(m[6], "ok ") {
			t.Errorf("bob's row %q: want user %s, via ssh, outcome ok", l, bob.name)
		}
	}
	if !regexp.MustCompile(`(?m)^\S+\s+` + bob.name + `\s+ssh\s+ps:scale\s+shop\s+ok\s+key=laptop scale=web=2$`).MatchString(out) {
		t.Errorf("the ps:scale row lacks its details, sorted:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^\S+\s+` + bob.name + `\s+ssh\s+config:set\s+shop\s+ok\s+key=laptop set=A unset=$`).MatchString(out) {
		t.Errorf("the config:set row lacks its details, sorted:\n%s", out)
	}

	// Each member sees their apps' changes only; an admin sees all.
	var page backend.AuditPage
	carol.json(&page, "audit")
	var got []string
	for _, e := range page.Entries {
		got = append(got, e.Command+" "+e.App)
		if e.User != carol.name || e.Via != backend.ViaSSH || e.Outcome != "ok" || e.Time.IsZero() {
			t.Errorf("carol's entry %+v", e)
		}
	}
	if !slices.Equal(got, carols) || page.Next != 0 {
		t.Errorf("carol's audit --json: %v (next %d), want %v", got, page.Next, carols)
	}
	carol.refused("has no access to app shop", "audit", "shop")
	bob.refused("has no access to app cart", "audit", "cart", "--json")
	admin.json(&page, "audit")
	got = got[:0]
	for i, e := range page.Entries {
		got = append(got, e.Command+" "+e.App)
		if i > 0 && e.Seq >= page.Entries[i-1].Seq {
			t.Errorf("the admin's trail is not newest first: %+v", page.Entries)
		}
	}
	if want := []string{"resume shop", "suspend cart", "suspend shop", "ps:scale shop", "config:set cart", "config:set shop", "apps:create cart", "apps:create shop"}; !slices.Equal(got, want) {
		t.Errorf("the admin's audit --json: %v, want %v", got, want)
	}

	// audit APP, as JSON.
	bob.json(&page, "audit", "shop")
	got = got[:0]
	for _, e := range page.Entries {
		got = append(got, e.Command+" "+e.App)
	}
	if !slices.Equal(got, bobs) || page.Next != 0 {
		t.Errorf("audit shop --json: %v (next %d), want %v", got, page.Next, bobs)
	}
	carol.json(&page, "audit", "cart")
	if len(page.Entries) != len(carols) {
		t.Errorf("audit cart --json: %+v", page.Entries)
	}

	// Pages of one, following the More: line to the end.
	got = got[:0]
	args := []string{"audit", "shop", "--limit", "1"}
	for range 10 {
		out := bob.ok("", args...)
		if strings.HasPrefix(out, "Nothing of shop was changed before entry ") {
			break // the last page was full: its More: line may lead to an empty one
		}
		rows, next := commandsOf(t, out)
		if len(rows) != 1 {
			t.Fatalf("%v shows %d entries:\n%s", args, len(rows), out)
		}
		got = append(got, rows...)
		if next == 0 {
			break
		}
		args = []string{"audit", "shop", "--limit", "1", "--before", strconv.FormatUint(next, 10)}
	}
	if !slices.Equal(got, bobs) {
		t.Errorf("audit shop by pages of one: %v, want %v", got, bobs)
	}
	// The first page's More: line is the newest entry's cursor, which --json
	// gives as next.
	bob.json(&page, "audit", "shop", "--limit", "2")
	if len(page.Entries) != 2 || page.Next != page.Entries[1].Seq {
		t.Fatalf("audit shop --limit 2 --json: %+v", page)
	}
	if out := bob.ok("", "audit", "shop", "--limit", "2"); !strings.HasSuffix(out, fmt.Sprintf("\nMore: audit shop --before %d\n", page.Next)) {
		t.Errorf("audit shop --limit 2 ends without its More: line:\n%s", out)
	}
	var older backend.AuditPage
	bob.json(&older, "audit", "shop", "--limit", "2", "--before", strconv.FormatUint(page.Next, 10))
	if len(older.Entries) != 2 || older.Entries[0].Command != "ps:scale" || older.Entries[0].Seq >= page.Next {
		t.Errorf("the page before %d: %+v", page.Next, older)
	}
	bob.refused("--limit 0: give 1 to 500 entries a page", "audit", "--limit", "0")
	bob.refused("--limit 501: give 1 to 500 entries a page", "audit", "--limit", "501")

	// An app nobody changed through bex (made straight through the API).
	quiet := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "quiet", Namespace: s.ns}, Spec: appv1.AppSpec{Members: []string{bob.name}}}
	if err := s.cp.Client.Create(ctx, quiet); err != nil {
		t.Fatal(err)
	}
	s.eventually(func() error {
		out, errOut, code := bob.ssh("", "audit", "quiet")
		if code != 0 {
			return errors.New(errOut)
		}
		if out != "Nothing of quiet was changed yet.\n" {
			t.Fatalf("audit of an app without entries: %q", out)
		}
		return nil
	})

	// An agent's failed deploy, as the backend keeps it for the MCP front end
	// (appended to the same store: the MCP server is not part of this test).
	long := "release v4 of shop did not roll out: " + strings.Repeat("web.1 exited with status 1; ", 6) + "the previous release keeps serving"
	if _, err := st.Append(audit.Entry{User: bob.name, Via: backend.ViaMCP, Token: "agent-7", Client: "claude-code 2.1", Command: "deploy",
		App: "shop", ReleaseBefore: 3, ReleaseAfter: 4, Reason: "ship the fix", Outcome: "failed", Error: long}); err != nil {
		t.Fatal(err)
	}
	out = bob.ok("", "audit", "shop", "--limit", "1")
	row := regexp.MustCompile(`(?m)^\S+\s+` + bob.name + `\s+mcp \(token agent-7\)\s+deploy\s+shop\s+v3 → v4\s+failed\s+(.*)$`).FindStringSubmatch(out)
	if row == nil {
		t.Fatalf("the agent's failed deploy:\n%s", out)
	}
	if cell := []rune(row[1]); len(cell) != 80 || !strings.HasSuffix(row[1], "…") || !strings.HasPrefix(long, string(cell[:79])) {
		t.Errorf("the error in the table is %q (%d runes), want its first 79 runes and …", row[1], len(cell))
	}
	bob.json(&page, "audit", "shop", "--limit", "1")
	if e := page.Entries[0]; e.Error != long || e.Token != "agent-7" || e.Reason != "ship the fix" || e.ReleaseBefore != 3 || e.ReleaseAfter != 4 {
		t.Errorf("the agent's entry in --json: %+v", e)
	}

	// This server has no edge figures.
	bob.refused("this server has no figures of its edge", "metrics", "shop")
}

// fixedTraffic is the edge's figures of every app, fixed: quiet in the last
// 5 minutes, 200 requests over the hour. It records what it was asked.
type fixedTraffic struct {
	mu    sync.Mutex
	asked []string
}

func (f *fixedTraffic) AppTraffic(_ context.Context, app string, windows ...time.Duration) ([]backend.TrafficWindow, error) {
	f.mu.Lock()
	f.asked = append(f.asked, fmt.Sprintf("%s %v", app, windows))
	f.mu.Unlock()
	out := make([]backend.TrafficWindow, len(windows))
	for i, w := range windows {
		out[i] = backend.TrafficWindow{Window: w}
		if w > 5*time.Minute {
			out[i] = backend.TrafficWindow{Window: w, Requests: 200, Status4xx: 3, Status5xx: 1, P50: 0.0042, P95: 0.25}
		}
	}
	return out, nil
}

// TestMetricsOverSSH, with the real ssh client against the real gitserver on
// a real API server and the edge's figures fixed: metrics APP prints a row
// per window, 5m and 60m, with the requests, the 4xx and 5xx and their rate,
// and the latency quantiles in ms ("-" for a window without requests);
// --json is AppMetrics. The backend asks the edge for the app's 5 and 60
// minutes; another member's metrics of it are refused without asking.
func TestMetricsOverSSH(t *testing.T) {
	traffic := &fixedTraffic{}
	s := newServer(t, func(c *backend.Config) { c.Traffic = traffic })
	bob := s.addUser("bob", appv1.RoleMember, true)
	carol := s.addUser("carol", appv1.RoleMember, true)
	bob.ok("", "apps:create", "shop")

	out := bob.ok("", "metrics", "shop")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		`^WINDOW\s+REQUESTS\s+4XX\s+5XX\s+P50\s+P95$`,
		`^5m\s+0\s+0\s+0\s+-\s+-$`,
		`^60m\s+200\s+3 \(1\.5%\)\s+1 \(0\.5%\)\s+4\.2ms\s+250ms$`,
	}
	if len(lines) != len(want) {
		t.Fatalf("metrics shop:\n%s", out)
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("metrics shop, line %d %q, want %s", i, lines[i], w)
		}
	}

	var m backend.AppMetrics
	bob.json(&m, "metrics", "shop")
	if m.App != "shop" || len(m.Windows) != 2 || m.Windows[0].Minutes != 5 || m.Windows[0].Requests != 0 ||
		m.Windows[1] != (backend.TrafficWindow{Window: 0, Minutes: 60, Requests: 200, Status4xx: 3, Status5xx: 1, P50: 0.0042, P95: 0.25}) {
		t.Errorf("metrics shop --json: %+v", m)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(bob.ok("", "metrics", "shop", "--json")), &raw); err != nil || raw["app"] != "shop" {
		t.Errorf("metrics --json: %v %v", raw, err)
	}

	carol.refused("has no access to app shop", "metrics", "shop")
	bob.refused("usage: metrics APP [--json]", "metrics")
	traffic.mu.Lock()
	asked := slices.Clone(traffic.asked)
	traffic.mu.Unlock()
	if len(asked) != 3 || asked[0] != "shop [5m0s 1h0m0s]" {
		t.Errorf("the edge was asked %q, want shop's 5 and 60 minutes, three times", asked)
	}

	// This server keeps no audit trail.
	bob.refused("this server keeps no audit trail", "audit")
}
