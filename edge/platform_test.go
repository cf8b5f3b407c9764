package edge

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// bex's own endpoints answer on the base domain itself, at their paths only; the
// platform host is known (it gets a certificate) like an app's; and an app whose
// custom domain claims it does not take it over.
func TestPlatformRoute(t *testing.T) {
	_, port := backend(t, "platform")
	cfg := Config{BaseDomain: "apps.test", PlatformBackend: fmt.Sprintf("127.0.0.1:%d", port)}.withDefaults()
	if cfg.PlatformHost != "apps.test" {
		t.Fatalf("platform host defaults to %q", cfg.PlatformHost)
	}
	e := newEnv(t, cfg)
	e.createApp("squatter", func(a *appv1.App) { a.Spec.Domains = []string{"apps.test"} })
	testenv.Eventually(t, 10*time.Second, "the squatter's route", e.known("squatter.apps.test"))

	for _, path := range []string{"/hooks/shop", "/mcp", "/mcp/session"} {
		expect(t, path, e.do("POST", "apps.test", path, strings.NewReader("{}"), nil), 200, "platform")
	}
	for _, path := range []string{"/", "/hooks", "/mcpx", "/admin"} {
		expect(t, path, e.do("GET", "apps.test", path, nil, nil), 404, "Nothing is served at apps.test")
	}
	if !e.table.Known("apps.test") {
		t.Error("the platform host is not known: it would get no certificate")
	}
	if !strings.Contains(e.log.String(), "domain claimed twice") || !strings.Contains(e.log.String(), "ignored=squatter") {
		t.Errorf("the squatter's claim was not reported:\n%s", e.log)
	}
}

func TestPlatformPaths(t *testing.T) {
	for path, want := range map[string]bool{
		"/hooks/app": true, "/hooks/": true, "/mcp": true, "/mcp/x": true,
		"/hooks": false, "/mcpx": false, "/": false, "/HOOKS/app": false,
	} {
		if got := IsPlatformPath(path); got != want {
			t.Errorf("IsPlatformPath(%q) = %v", path, got)
		}
	}
	if err := (Config{PlatformBackend: "nohostport"}).Validate(); err == nil {
		t.Error("a platform backend without a port was accepted")
	}
}
