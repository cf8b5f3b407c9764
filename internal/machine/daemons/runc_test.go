package daemons

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuncFixed(t *testing.T) {
	for v, want := range map[string]bool{
		"1.1.5+ds1": false, "1.1.15": false, "1.0.0": false,
		"1.2.7": false, "1.2.8": true, "1.2.9": true,
		"1.3.2": false, "1.3.3": true, "1.3.3+dev": true,
		"1.4.0-rc.2": false, "1.4.0": true, "1.4.1": true,
		"1.5.0-rc.1": true, "1.5.3": true, "2.0.0": true,
		"": false, "x.y.z": false, "1.4": false,
	} {
		if got := RuncFixed(v); got != want {
			t.Errorf("RuncFixed(%q) = %v, want %v", v, got, want)
		}
	}
}

// Debian's runc (1.1.5) is refused with one line that says what to do; a runc
// with the fixes is taken. Both are stand-ins that print what each prints.
func TestCheckRuncRefusesAnOldOne(t *testing.T) {
	dir := t.TempDir()
	write := func(name, out string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nprintf '"+out+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := write("old", `runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n`)
	_, err := CheckRunc(old)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), "1.1.5+ds1") {
		t.Fatalf("old runc: %v", err)
	}
	v, err := CheckRunc(write("new", `runc version 1.5.3\ncommit: v1.5.3\n`))
	if err != nil || v != "1.5.3" {
		t.Fatalf("new runc: %q, %v", v, err)
	}
	if _, err := CheckRunc(write("other", `hello\n`)); err == nil {
		t.Fatal("a program that is not runc was taken")
	}
}
