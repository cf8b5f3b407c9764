package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUpLogFormatReachesEveryChild: `bex up --log-format json` makes the
// deployer, the edge and the gitserver it starts log JSON too. The format once
// went to them through an environment variable that bex up itself drops from its
// children's environment, so they logged text.
func TestUpLogFormatReachesEveryChild(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	p.start(t, "--log-format", "json")
	// Something for each child to log: the gitserver audits the command, the
	// deployer reconciles the new App, and the edge logs its shutdown on stop.
	if out, errOut, err := p.ssh(t, "apps:create", "logfmt"); err != nil {
		t.Fatalf("apps:create: %v\n%s%s", err, out, errOut)
	}
	p.stop(t)

	for _, child := range []struct{ name, wantMsg string }{
		{"deployer", ""},
		{"edge", "edge: shutting down, draining requests in flight"},
		{"gitserver", "audit"},
	} {
		data, err := os.ReadFile(filepath.Join(p.dir, "logs", child.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		var msgs []string
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("%s logged a line that is not JSON: %q\n%s", child.name, line, data)
				break
			}
			msg, _ := rec["msg"].(string)
			msgs = append(msgs, msg)
		}
		if len(msgs) == 0 {
			t.Errorf("%s logged nothing", child.name)
		}
		if child.wantMsg != "" && !slices.Contains(msgs, child.wantMsg) {
			t.Errorf("%s did not log %q; its log:\n%s", child.name, child.wantMsg, data)
		}
	}
}
