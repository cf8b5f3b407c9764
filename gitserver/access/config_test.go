package access_test

import (
	"strings"
	"testing"

	"bex.co/bex/gitserver/access"
)

func TestConfig(t *testing.T) {
	if err := (access.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	d := access.DefaultConfig()
	if d.Namespace != access.DefaultNamespace {
		t.Fatalf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, bad := range []access.Config{
		{Namespace: "Upper"},
		{Namespace: "under_score"},
		{Namespace: "a-very-long-namespace-name-that-is-longer-than-sixty-three-characters"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", bad)
		}
	}
	// The problem by its field.
	if err := (access.Config{Namespace: "Upper"}).Validate(); err == nil || !strings.Contains(err.Error(), "Config.Namespace") {
		t.Errorf("Validate() = %v, want it to name Config.Namespace", err)
	}
}
