package runtime

import "testing"

// TestParseExecFailure reads runc's messages, as containerd and the kubelet
// pass them on, into a shell's statuses.
func TestParseExecFailure(t *testing.T) {
	const prefix = `failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: `
	for _, c := range []struct {
		msg    string
		status int
		line   string
	}{
		{prefix + `exec: "nosuchcmd": executable file not found in $PATH: unknown`, 127, "bex: nosuchcmd: command not found"},
		{prefix + `exec: "./nope": stat ./nope: no such file or directory: unknown`, 127, "bex: ./nope: No such file or directory"},
		{prefix + `exec: "/www/index.html": permission denied: unknown`, 126, "bex: /www/index.html: Permission denied"},
		{prefix + `exec: "/www": is a directory: unknown`, 126, "bex: /www: Is a directory"},
		{prefix + `exec: "a \"quoted\" name": executable file not found in $PATH: unknown`, 127, `bex: a "quoted" name: command not found`},
	} {
		f := ParseExecFailure(c.msg)
		if f == nil || f.Status != c.status || f.Error() != c.line {
			t.Errorf("%s: %+v, want %d %q", c.msg, f, c.status, c.line)
		}
	}
	for _, msg := range []string{"", "cannot start: image not found", prefix + "unable to apply cgroup configuration: permission denied"} {
		if f := ParseExecFailure(msg); f != nil {
			t.Errorf("%q read as %+v", msg, f)
		}
	}
}
