package access_test

import (
	"strings"
	"testing"
	"time"

	"bex.co/bex/gitserver/access"
)

func TestConfig(t *testing.T) {
	if err := (access.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	d := access.DefaultConfig()
	if d.Namespace != access.DefaultNamespace || d.CacheWait != access.DefaultCacheWait {
		t.Fatalf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, bad := range []access.Config{
		{Namespace: "Upper"},
		{Namespace: "under_score"},
		{Namespace: "a-very-long-namespace-name-that-is-longer-than-sixty-three-characters"},
		{CacheWait: -time.Second},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", bad)
		}
	}
	// Every problem at once, each by its field.
	err := access.Config{Namespace: "Upper", CacheWait: -time.Second}.Validate()
	for _, want := range []string{"Config.Namespace", "Config.CacheWait"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}
