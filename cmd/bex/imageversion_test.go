package main

import "testing"

// TestImageVersion: the version a database image offers is its tag, whatever
// the registry's port or a digest says.
func TestImageVersion(t *testing.T) {
	for ref, want := range map[string]string{
		"postgres:15":                   "15",
		"bex-base.local/postgres:15":    "15",
		"localhost:5000/postgres":       "",
		"localhost:5000/pg:16.4":        "16.4",
		"redis:7@sha256:" + sha256Zeros: "7",
		"redis@sha256:" + sha256Zeros:   "",
		"not a reference":               "",
	} {
		if got := imageVersion(ref); got.Version != want || got.Ref != ref {
			t.Errorf("imageVersion(%q) = %+v, want version %q", ref, got, want)
		}
	}
}

const sha256Zeros = "0000000000000000000000000000000000000000000000000000000000000000"
