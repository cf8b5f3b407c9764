package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestCronJobs: bex up as its own process, a busybox app pushed over ssh, cron
// jobs set on its App (through the API with kubectl: app.json's "cron" is read
// by the builder on another branch), then `cron --json` lists a job's exit
// after its runs, an overlapping run is skipped, and `cron:run` starts a job at
// once with its output under `logs --process cron.<id>`. Schedules are
// "@every 2s": no minute is waited for.
func TestCronJobs(t *testing.T) {
	p := sharedPlatform(t)
	app := p.newRepo(t, "hello-shell", "crony")
	if out, err := app.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	p.kubectl(t, "patch", "app", "crony", "--type", "merge", "-p", `{"spec":{"cron":[`+
		`{"id":"tick","command":"echo tick; exit 2","schedule":"@every 2s"},`+
		`{"id":"slow","command":"sleep 7","schedule":"@every 2s"},`+
		`{"id":"hand","command":"echo by hand","schedule":"@yearly"}]}}`)

	type job struct {
		ID           string     `json:"id"`
		Command      string     `json:"command"`
		Schedule     string     `json:"schedule"`
		LastRun      *time.Time `json:"lastRun"`
		LastExitCode *int32     `json:"lastExitCode"`
		NextRun      *time.Time `json:"nextRun"`
		Running      int32      `json:"running"`
		Skipped      int32      `json:"skipped"`
	}
	list := func() (map[string]job, error) {
		out, errOut, err := p.ssh(t, "cron", "crony", "--json")
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
	testenv.Eventually(t, 90*time.Second, "tick exited 2 and a slow run was skipped", func() error {
		m, err := list()
		if err != nil {
			return err
		}
		if tk := m["tick"]; tk.LastExitCode == nil || *tk.LastExitCode != 2 || tk.LastRun == nil || tk.NextRun == nil {
			return fmt.Errorf("tick %+v", tk)
		}
		if s := m["slow"]; s.Skipped < 1 || s.Running != 1 {
			return fmt.Errorf("slow %+v", s)
		}
		if h := m["hand"]; h.LastRun != nil {
			return fmt.Errorf("hand ran on its own: %+v", h)
		}
		return nil
	})
	t.Logf("a run's exit and a skip listed %s after the jobs were set", time.Since(began).Round(time.Millisecond))

	out, errOut, err := p.ssh(t, "cron:run", "crony", "hand")
	if err != nil || !strings.Contains(out, "--process cron.hand") {
		t.Fatalf("cron:run: %v\n%s%s", err, out, errOut)
	}
	began = time.Now()
	testenv.Eventually(t, 60*time.Second, "the cron:run's output in logs", func() error {
		out, errOut, err := p.ssh(t, "logs", "crony", "--process", "cron.hand")
		if err != nil || !strings.Contains(out, "by hand") {
			return fmt.Errorf("logs: %v: %s%s", err, out, errOut)
		}
		m, err := list()
		if err != nil {
			return err
		}
		if h := m["hand"]; h.LastExitCode == nil || *h.LastExitCode != 0 {
			return fmt.Errorf("hand %+v", h)
		}
		return nil
	})
	t.Logf("cron:run to its output and exit 0: %s", time.Since(began).Round(time.Millisecond))
	if _, errOut, err := p.ssh(t, "cron:run", "crony", "nope"); err == nil || !strings.Contains(errOut, "its jobs are tick, slow, hand") {
		t.Errorf("cron:run of an unknown id: %v %q", err, errOut)
	}
	logs, _, _ := p.ssh(t, "logs", "crony", "--process", "cron.tick")
	if !strings.Contains(logs, "tick") {
		t.Errorf("cron.tick's logs: %q", logs)
	}
	// Three failed runs in a row show in apps:info.
	testenv.Eventually(t, 60*time.Second, "apps:info shows the failing job", func() error {
		info, _, err := p.ssh(t, "apps:info", "crony")
		if err != nil || !strings.Contains(info, "Cron tick:") || !strings.Contains(info, "last exit 2") {
			return fmt.Errorf("apps:info: %v\n%s", err, info)
		}
		if !strings.Contains(info, "Phase:") || !strings.Contains(info, "Running") {
			return fmt.Errorf("a failing job changed the phase:\n%s", info)
		}
		return nil
	})
}
