package access_test

import (
	"testing"
	"time"

	"bex.co/bex/gitserver/access"
)

func TestConfig(t *testing.T) {
	if err := (access.Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	d := access.Config{}.WithDefaults()
	if d.Namespace != access.DefaultNamespace || d.CacheWait != access.DefaultCacheWait {
		t.Fatalf("defaults %+v", d)
	}
	if got := (access.Config{Namespace: "apps", CacheWait: time.Second}).WithDefaults(); got.Namespace != "apps" || got.CacheWait != time.Second {
		t.Fatalf("WithDefaults overrode set fields: %+v", got)
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
}
