package main

import (
	"strings"
	"testing"
)

// TestWithUID: the operand image's /etc/passwd gives postgres the uid CNPG runs
// the instances as, changes nothing else, and refuses a uid another user has.
func TestWithUID(t *testing.T) {
	const passwd = "root:x:0:0:root:/root:/bin/bash\n" +
		"daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n" +
		"postgres:x:100:102:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n"
	got, err := withUID([]byte(passwd), "postgres", 26)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(passwd, "postgres:x:100:102:", "postgres:x:26:102:", 1)
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := withUID([]byte(passwd), "postgres", 1); err == nil || !strings.Contains(err.Error(), "daemon has the uid 1") {
		t.Errorf("a uid daemon has: %v, want refused", err)
	}
	if _, err := withUID([]byte("root:x:0:0:root:/root:/bin/bash\n"), "postgres", 26); err == nil {
		t.Error("no postgres user: no error")
	}
}
