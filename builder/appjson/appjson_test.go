package appjson

import (
	"errors"
	"strings"
	"testing"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

func TestParse(t *testing.T) {
	f, err := Parse([]byte(`{
  "name": "x",
  "addons": [],
  "formation": {"web": {"quantity": 2}, "worker": {"quantity": 0, "size": "basic"}},
  "healthchecks": {"web": [{"type": "startup", "path": "/health", "timeout": 4, "attempts": 2, "wait": 3, "initialDelay": 1, "content": "ok"}, {"type": "liveness", "path": "/l"}], "worker": [{"type": "startup", "command": ["true"]}]},
  "cron": [{"command": "./report --daily", "schedule": "@daily", "concurrency_policy": "replace"}, {"command": "echo hi", "schedule": "*/5 * * * *"}, {"command": "x", "schedule": "@every 1h30m"}],
  "scripts": {"dokku": {"predeploy": "./migrate", "postdeploy": "./warm"}, "postdeploy": "./seed"}
}`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Formation["web"] != 2 || f.Formation["worker"] != 0 || len(f.Formation) != 2 {
		t.Errorf("formation %v", f.Formation)
	}
	want := appv1.HealthCheck{Path: "/health", TimeoutSeconds: 4, BootTimeoutSeconds: 1 + 2*(4+3)}
	if f.HealthCheck == nil || *f.HealthCheck != want {
		t.Errorf("health check %+v, want %+v", f.HealthCheck, want)
	}
	if len(f.Cron) != 3 || f.Cron[0].ConcurrencyPolicy != appv1.CronReplace || f.Cron[1].Policy() != appv1.CronForbid ||
		f.Cron[0].ID != appv1.CronJobID("@daily", "./report --daily") || f.Cron[2].Schedule != "@every 1h30m" {
		t.Errorf("cron %+v", f.Cron)
	}
	// Dokku's three phases are three scripts: Heroku's postdeploy is the one
	// that runs once, not a fallback of dokku.postdeploy.
	if f.Predeploy != "./migrate" || f.Postdeploy != "./warm" || f.FirstPostdeploy != "./seed" {
		t.Errorf("scripts %q %q %q", f.Predeploy, f.Postdeploy, f.FirstPostdeploy)
	}
	all := strings.Join(f.Warnings, "\n")
	for _, w := range []string{`app.json: "addons" is ignored: bex does not read it`, `app.json: "name" is ignored`, "formation.worker.size is ignored",
		"healthchecks.web[0].content is ignored", "healthchecks.web[1] is ignored", "healthchecks.worker[0] is ignored"} {
		if !strings.Contains(all, w) {
			t.Errorf("no warning %q in:\n%s", w, all)
		}
	}
}

// TestJSONC reads app.json as Dokku does since 0.38: comments of both kinds and
// trailing commas.
func TestJSONC(t *testing.T) {
	f, err := Parse([]byte(`// Dokku's own fixtures carry comments
{
  /* the release tasks */
  "scripts": {"dokku": {"predeploy": "touch /app/predeploy.test", "postdeploy": "echo done",},},
  "cron": [
    {"command": "echo hi", "schedule": "@daily"}, // daily
  ],
}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Predeploy != "touch /app/predeploy.test" || f.Postdeploy != "echo done" || len(f.Cron) != 1 {
		t.Errorf("%+v", f)
	}
}

func TestDefaults(t *testing.T) {
	f, err := Parse([]byte(`{"healthchecks": {"web": [{"path": "/"}]}, "scripts": {"postdeploy": {"command": "./seed", "size": "x"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if *f.HealthCheck != (appv1.HealthCheck{Path: "/", TimeoutSeconds: 5, BootTimeoutSeconds: 30}) {
		t.Errorf("%+v", f.HealthCheck)
	}
	if f.FirstPostdeploy != "./seed" || f.Postdeploy != "" {
		t.Errorf("postdeploy %q, first postdeploy %q", f.Postdeploy, f.FirstPostdeploy)
	}
	f, err = Parse([]byte(`{"healthchecks": {"web": [{"path": "/", "attempts": 100, "timeout": 300}]}}`))
	if err != nil || f.HealthCheck.BootTimeoutSeconds != MaxBootTimeout {
		t.Errorf("capped boot timeout: %+v %v", f.HealthCheck, err)
	}
	f, err = Parse([]byte(`{}`))
	if err != nil || f.HealthCheck != nil || f.Cron != nil || f.Formation != nil || len(f.Warnings) != 0 {
		t.Errorf("empty: %+v %v", f, err)
	}
}

func TestErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"{\n  \"cron\": [\n    {\n      \"command\": \"x\",\n\n\n      \"schedule\": \"every day\"\n    }\n  ]\n}",
			`app.json line 7: cron[0].schedule: "every day" is not a cron schedule: use 5 fields such as "0 3 * * *" or @daily`},
		{"{\n  \"formation\": {\n    \"web\": {\"quantity\": 2 3}\n  }\n}", "app.json line 3: not JSON: invalid character '3'"},
		{"// the app\n{\n  /* many\n  lines */\n  \"cron\": [{\"command\": \"x\", \"schedule\": \"soon\",},],\n}", `app.json line 5: cron[0].schedule: "soon" is not a cron schedule`},
		{"{\"cron\": [] /* never closed", "app.json line 1: not JSON: unexpected end of the file"},
		{"{\"a\": 1", "app.json line 1: not JSON: unexpected end of the file"},
		{"[]", "app.json line 1: app.json is a JSON object"},
		{"{} {}", "text after the end"},
		{`{"formation": {"web": {"quantity": 101}}}`, "formation.web.quantity: 101 is out of range: use 0 to 100"},
		{`{"formation": {"web": {"quantity": "2"}}}`, "formation.web.quantity: is a string, and it should be a whole number"},
		{`{"formation": {"Web": {"quantity": 1}}}`, `formation.Web: "Web" is not a process type name`},
		{`{"cron": [{"command": "x"}]}`, "cron[0]: has no schedule"},
		{`{"cron": [{"schedule": "@daily"}]}`, "cron[0]: has no command"},
		{`{"cron": [{"command": "a\nb", "schedule": "@daily"}]}`, "cron[0].command: is more than one line"},
		{`{"cron": [{"command": "a", "schedule": "* * * * * *"}]}`, "is not a cron schedule"},
		{`{"cron": [{"command": "a", "schedule": "TZ=UTC @daily"}]}`, "sets a time zone"},
		{`{"cron": [{"command": "a", "schedule": "@daily", "concurrency_policy": "sometimes"}]}`, "cron[0].concurrency_policy: \"sometimes\" is not a policy"},
		{`{"cron": [{"command": "a", "schedule": "@daily"}, {"command": "a", "schedule": "@daily"}]}`, "cron[1]: is the same job as cron[0]"},
		{`{"cron": {}}`, "cron: is an object, and it should be a list of jobs"},
		{`{"healthchecks": {"web": [{"path": "health"}]}}`, `healthchecks.web[0].path: "health" is not a path`},
		{`{"healthchecks": {"web": [{"path": "/", "timeout": 0}]}}`, "healthchecks.web[0].timeout: 0 is out of range"},
		{`{"scripts": {"dokku": {"predeploy": ""}}}`, "scripts.dokku.predeploy: is empty"},
		{`{"scripts": {"dokku": {"predeploy": 3}}}`, "scripts.dokku.predeploy: is a number"},
		{`{"scripts": {"dokku": {"predeploy": "` + strings.Repeat("a", MaxCommandSize+1) + `"}}}`, "is 4097 bytes long"},
		{`{"a": "` + strings.Repeat("a", MaxSize) + `"}`, "bex reads at most 65536"},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), "nested too deeply"},
	} {
		_, err := Parse([]byte(c.in))
		var perr *Error
		if !errors.As(err, &perr) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60q: got %v, want %q", c.in, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%.60q: error of more than one line: %q", c.in, err)
		}
	}
}

func TestCronBound(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"cron": [`)
	for i := 0; i <= MaxCronJobs; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"command": "echo ` + strings.Repeat("x", i) + `", "schedule": "@hourly"}`)
	}
	b.WriteString("]}")
	if _, err := Parse([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "at most 50") {
		t.Errorf("51 jobs: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"cron": [{"command": "x", "schedule": "@daily"}], "formation": {"web": {"quantity": 1}}}`))
	f.Add([]byte(`{"healthchecks": {"web": [{"path": "/", "attempts": 9}]}, "scripts": {"dokku": {"predeploy": "m"}}}`))
	f.Add([]byte("{\n\"cron\": [1,"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "app.json") {
				t.Fatalf("error %q", err)
			}
			return
		}
		if len(file.Cron) > MaxCronJobs || len(file.Warnings) > maxWarnings {
			t.Fatalf("unbounded: %d jobs, %d warnings", len(file.Cron), len(file.Warnings))
		}
		for _, c := range file.Cron {
			if len(c.Command) > MaxCommandSize || len(c.Schedule) > MaxScheduleSize || len(c.ID) != 10 {
				t.Fatalf("job %+v", c)
			}
		}
		if hc := file.HealthCheck; hc != nil && (hc.BootTimeoutSeconds < 1 || hc.BootTimeoutSeconds > MaxBootTimeout || hc.TimeoutSeconds < 1) {
			t.Fatalf("health check %+v", hc)
		}
		for _, q := range file.Formation {
			if q < 0 || q > MaxReplicas {
				t.Fatalf("quantity %d", q)
			}
		}
	})
}
