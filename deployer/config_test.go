package deployer

import (
	"strings"
	"testing"
)

// TestConfigValidate: the defaults are valid, and a config with several problems
// is refused with every one of them, each by its field.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := DefaultConfig()
	bad.BaseDomain, bad.URLScheme, bad.HTTPSPort, bad.KeepReleases, bad.Concurrency, bad.RequeueWhileRolling = "", "ftp", 70000, 0, 0, 0
	bad.ImageRepo = "bex.local/shop:v1"
	err := bad.Validate()
	for _, want := range []string{"Config.BaseDomain", "Config.URLScheme", "Config.HTTPSPort", "Config.KeepReleases",
		"Config.ImageRepo", "Config.Concurrency", "Config.RequeueWhileRolling"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	for _, ok := range []string{"", "bex.local", "registry.example:5000/apps"} {
		c := DefaultConfig()
		c.ImageRepo = ok
		if err := c.Validate(); err != nil {
			t.Errorf("ImageRepo %q: %v", ok, err)
		}
	}
}
