package sshcmd_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

func TestCronCommands(t *testing.T) {
	a := deployed(app("shop", "bob"))
	a.Spec.Cron = []appv1.CronJob{{ID: "aaa", Command: "echo tick;\n exit 2", Schedule: "*/5 * * * *"}, {ID: "bbb", Command: "true", Schedule: "@daily"}}
	code := int32(2)
	a.Status.Cron = []appv1.CronJobStatus{{ID: "aaa", LastRun: &metav1.Time{Time: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}, LastExitCode: &code, ConsecutiveFailures: 4}}
	f := newFixture(t, a, user("bob", appv1.RoleMember))

	out, errOut, rc := f.run(bob, "", "cron", "shop")
	if rc != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, "aaa") || !strings.Contains(out, "2026-12-01T10:00:00Z") ||
		!strings.Contains(out, "exit 2 FAILING ×4") || !strings.Contains(out, "none yet") || strings.Count(out, "\n") != 3 {
		t.Fatalf("cron table (rc %d):\n%s%s", rc, out, errOut)
	}
	out, _, rc = f.run(bob, "", "cron", "shop", "--json")
	var jobs []map[string]any
	if rc != 0 || json.Unmarshal([]byte(out), &jobs) != nil || len(jobs) != 2 {
		t.Fatalf("cron --json (rc %d): %s", rc, out)
	}
	for _, k := range []string{"id", "command", "schedule", "lastRun", "lastExitCode", "nextRun"} {
		if _, ok := jobs[1][k]; !ok {
			t.Errorf("--json lacks %q: %s", k, out)
		}
	}
	if jobs[1]["lastRun"] != nil || jobs[1]["lastExitCode"] != nil || jobs[0]["lastExitCode"] != float64(2) {
		t.Errorf("--json values: %s", out)
	}
	// The contract's fields come first, in order.
	var raw []json.RawMessage
	_ = json.Unmarshal([]byte(out), &raw)
	if !strings.HasPrefix(strings.Join(strings.Fields(string(raw[1])), ""), `{"id":"bbb","command":"true","schedule":"@daily","lastRun":null,"lastExitCode":null,"nextRun":"`) {
		t.Errorf("--json order: %s", raw[1])
	}

	info, _, _ := f.run(bob, "", "apps:info", "shop")
	if !strings.Contains(info, "Cron aaa:") || !strings.Contains(info, "failing: 4 runs in a row exited non-zero, last exit 2 (echo tick; exit 2)") || strings.Contains(info, "Cron bbb") {
		t.Errorf("apps:info:\n%s", info)
	}

	_, errOut, rc = f.run(bob, "", "cron:run", "shop", "zzz")
	if rc == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, `no cron job "zzz": its jobs are aaa, bbb`) {
		t.Errorf("cron:run of an unknown id (rc %d): %q", rc, errOut)
	}
	out, errOut, rc = f.run(bob, "", "cron:run", "shop", "bbb")
	if rc != 0 || !strings.Contains(out, "logs shop --process cron.bbb") {
		t.Fatalf("cron:run (rc %d): %s%s", rc, out, errOut)
	}
	if f.app("shop").CronRuns()["bbb"] == "" {
		t.Errorf("no cron:run annotation: %v", f.app("shop").Annotations)
	}
	_, _, rc = f.run(carol, "", "cron", "shop")
	if rc == 0 {
		t.Errorf("a stranger listed the cron jobs")
	}
}
