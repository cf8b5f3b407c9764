package main

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

func TestHtpasswd(t *testing.T) {
	var out bytes.Buffer
	if err := run(strings.NewReader("builder s3cret\n\ndeployer other pass\n"), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := map[string]string{"builder": "s3cret", "deployer": "other pass"}
	if len(lines) != len(want) {
		t.Fatalf("got %q", out.String())
	}
	for _, l := range lines {
		name, hash, _ := strings.Cut(l, ":")
		if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte(want[name])); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte("wrong")); err == nil {
			t.Errorf("%s: a wrong password matches", name)
		}
	}
	for _, bad := range []string{"", "builder\n", "Bad:name pass\n"} {
		if err := run(strings.NewReader(bad), &out); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
