package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func runBex(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRoot(&out, &errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String() + errOut.String(), err
}

func TestVersion(t *testing.T) {
	out, err := runBex(t, "version")
	if err != nil {
		t.Fatalf("bex version: %v", err)
	}
	if !strings.HasPrefix(out, "bex "+version+" (go") {
		t.Fatalf("bex version printed %q", out)
	}
}

func TestVersionJSON(t *testing.T) {
	out, err := runBex(t, "version", "--json")
	if err != nil {
		t.Fatalf("bex version --json: %v", err)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("not JSON: %q: %v", out, err)
	}
	if v["version"] != version || v["go"] == "" || v["platform"] == "" {
		t.Fatalf("bex version --json = %v", v)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	_, err := runBex(t, "no-such-command")
	if err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("want an unknown-command error, got %v", err)
	}
}
