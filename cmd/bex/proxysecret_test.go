package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEdgeRefusesABadPlatformSecret: a proxy secret that is short, or given
// without the backend it would go to, is refused by its flag before the API
// is dialled, and the error does not show the file's content.
func TestEdgeRefusesABadPlatformSecret(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--platform-backend", "127.0.0.1:8090", "--platform-secret-file", short}, "--platform-secret-file: " + short + ": 7 bytes, want at least 16"},
		{[]string{"--platform-backend", "127.0.0.1:8090", "--platform-secret-file", filepath.Join(dir, "missing")}, "--platform-secret-file: open " + dir},
		{[]string{"--platform-secret-file", short}, "--platform-secret-file: give --platform-backend too"},
	} {
		_, err := runBex(t, append([]string{"edge", "--kubeconfig", dir + "/none"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("bex edge %q: %v, want it to say %q (and not the secret)", c.args, err, c.want)
		}
	}
}
