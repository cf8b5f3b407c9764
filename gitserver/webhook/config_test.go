package webhook

import (
	"net/netip"
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
	bad.Prefix, bad.Burst, bad.LookupTimeout = "hooks", 0, 0
	bad.BadSignatures.Burst, bad.TrustedProxies = 0, []netip.Prefix{{}}
	err := bad.Validate()
	for _, want := range []string{"Config.Prefix", "Config.Burst", "Config.LookupTimeout", "Config.BadSignatures.Burst", "Config.TrustedProxies[0]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}
