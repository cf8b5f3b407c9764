package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestCronJobs: cron jobs of an app pushed to the cluster are CronJobs that
// the node runs. A job due every minute runs on its schedule (the
// kube-controller-manager's CronJob controller, the real clock: at most a
// minute's wait, while the package's other tests run) and `cron --json` lists
// its exit status; `cron:run` starts a job at once, its output under
// `logs --process cron.<id>`; a job removed from the App loses its CronJob.
func TestCronJobs(t *testing.T) {
	t.Parallel()
	const app = "crony"
	mustPush(t, newHostRepo(t, app))
	kubectl(t, "patch", "apps.app.bex.co", app, "--type", "merge", "-p", `{"spec":{"cron":[`+
		`{"id":"tick","command":"echo tick from $HOSTNAME; exit 3","schedule":"* * * * *"},`+
		`{"id":"hand","command":"echo by hand","schedule":"@yearly"}]}}`)

	type job struct {
		ID           string     `json:"id"`
		LastRun      *time.Time `json:"lastRun"`
		LastExitCode *int32     `json:"lastExitCode"`
		NextRun      *time.Time `json:"nextRun"`
	}
	list := func() (map[string]job, error) {
		out, errOut, err := bex("cron", app, "--json")
		if err != nil {
			return nil, fmt.Errorf("cron --json: %v: %s", err, errOut)
		}
		var jobs []job
		if err := json.Unmarshal([]byte(out), &jobs); err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		m := map[string]job{}
		for _, j := range jobs {
			m[j.ID] = j
		}
		return m, nil
	}

	began := time.Now()
	out := bexOK(t, "cron:run", app, "hand")
	if !strings.Contains(out, "--process cron.hand") {
		t.Errorf("cron:run says %q", out)
	}
	testenv.Eventually(t, 60*time.Second, "the cron:run of hand ended with 0, its output in logs", func() error {
		m, err := list()
		if err != nil {
			return err
		}
		if h := m["hand"]; h.LastExitCode == nil || *h.LastExitCode != 0 || h.LastRun == nil {
			return fmt.Errorf("hand %+v", h)
		}
		if logs := bexOK(t, "logs", app, "--process", "cron.hand"); !strings.Contains(logs, "by hand") {
			return fmt.Errorf("logs: %q", logs)
		}
		return nil
	})
	t.Logf("cron:run to its exit and logs in %.1f s", time.Since(began).Seconds())
	if runs := kubectl(t, "get", "jobs", "-l", "app.bex.co/cron-job=hand", "-o", "name"); len(strings.Fields(runs)) != 1 {
		t.Errorf("one cron:run made the Jobs %q", runs)
	}

	testenv.Eventually(t, 150*time.Second, "tick ran on its schedule and exited 3", func() error {
		m, err := list()
		if err != nil {
			return err
		}
		if tk := m["tick"]; tk.LastExitCode == nil || *tk.LastExitCode != 3 || tk.LastRun == nil || tk.NextRun == nil {
			return fmt.Errorf("tick %+v", tk)
		}
		return nil
	})
	t.Logf("a scheduled run's exit listed %.1f s after the jobs were set", time.Since(began).Seconds())
	if logs := bexOK(t, "logs", app, "--process", "cron.tick"); !strings.Contains(logs, "tick from "+app+"-tick-") {
		t.Errorf("logs of tick: %q", logs)
	}

	kubectl(t, "patch", "apps.app.bex.co", app, "--type", "json", "-p", `[{"op":"remove","path":"/spec/cron/0"}]`)
	testenv.Eventually(t, 30*time.Second, "the CronJob of tick is gone", func() error {
		if left := kubectl(t, "get", "cronjobs", "-l", "app.bex.co/cron-job=tick", "-o", "name"); left != "" {
			return fmt.Errorf("still there: %s", left)
		}
		return nil
	})
}
