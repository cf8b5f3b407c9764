package baseimage

import (
	"maps"
	"slices"
	"testing"
)

// TestKindsSelectWhatTheyArePickedFrom: Config.Kinds limits what Build makes to
// the kinds named and those their files are picked from, and none means all.
func TestKindsSelectWhatTheyArePickedFrom(t *testing.T) {
	c := DefaultConfig()
	all := c.standIns("go1.26.0")
	for _, tc := range []struct {
		kinds, want []string
	}{
		{nil, []string{"debian", "golang", "node", "php", "postgres", "python", "redis", "ruby", "runtime", "stack"}},
		{[]string{"postgres"}, []string{"postgres"}},
		{[]string{"runtime"}, []string{"golang", "runtime"}},
		{[]string{"redis", "postgres"}, []string{"postgres", "redis"}},
	} {
		c.Kinds = tc.kinds
		got := slices.Sorted(maps.Keys(c.selected(all)))
		if !slices.Equal(got, tc.want) {
			t.Errorf("Kinds %v: Build makes %v, want %v", tc.kinds, got, tc.want)
		}
	}
}
