package backend

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// TestSeenSince: the cache has seen a write when it holds that version or a
// later one, whoever wrote it: the deployer's status write right after a
// member change (a later version, the same generation) counts, which the
// version's equality alone did not (cmd/bex's storage test waited out the
// 30 s bound once in a clean-clone run).
func TestSeenSince(t *testing.T) {
	app := func(rv string, gen int64) *appv1.App {
		return &appv1.App{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv, Generation: gen}}
	}
	updated := app("1042", 7)
	for _, tc := range []struct {
		name   string
		cached *appv1.App
		want   bool
	}{
		{"the write itself", app("1042", 7), true},
		{"a status write after it", app("1043", 7), true},
		{"a version with more digits", app("10420", 7), true},
		{"before the write", app("1041", 6), false},
		{"before the write, shorter", app("999", 6), false},
		{"versions that are not integers: equal", &appv1.App{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "x", Generation: 7}}, false},
	} {
		if got := seenSince(tc.cached, updated); got != tc.want {
			t.Errorf("%s: seenSince(%s, %s) = %v, want %v", tc.name, tc.cached.ResourceVersion, updated.ResourceVersion, got, tc.want)
		}
	}
	odd := &appv1.App{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "abc", Generation: 3}}
	if !seenSince(odd, odd) || !seenSince(&appv1.App{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "abd", Generation: 4}}, odd) {
		t.Error("opaque versions: the same version, or a later generation, is seen")
	}
}
